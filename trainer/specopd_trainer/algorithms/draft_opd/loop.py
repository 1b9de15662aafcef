"""Draft-OPD against a live server on the shared engine (one process, or ranks under ``torchrun``: :mod:`.ranks`).

One step: push the drafter every ``push_every`` steps (before the step's rollouts, so they are on-policy), get
rollouts from the source (live prompts or recorded traffic, :mod:`.rollouts`), drop stale records
(:mod:`.versions`), select the blocks to replay (error anchors or random ones), and train on them
(:func:`.replay.draft_opd_step`, or :func:`.replay.sft_step` without replay). Metrics per step: loss, served
acceptance statistics of the fresh records (``rollout_tau``, ``accepted_per_slot``, ``rejected_per_slot``),
replayed ``blocks`` / ``accepted_tokens`` / ``rejected_tokens``, ``est_tau``, ``stale_records``,
``unknown_version_records``, and the cumulative ``supervised_tokens`` / ``supervised_tokens_per_s``
(:mod:`specopd_trainer.loops.counters`, kept across resumes). Under ``torchrun`` the counts are summed and the rates
and means averaged over ranks (:func:`.ranks.reduce_metrics`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from specopd_trainer.algorithms.draft_opd.config import DraftOPDConfig
from specopd_trainer.algorithms.draft_opd.ranks import (ReplayStep, agree_or_raise, all_sum, broadcast_version,
                                                        reduce_metrics)
from specopd_trainer.algorithms.draft_opd.replay import rollout_stats, select_blocks
from specopd_trainer.algorithms.draft_opd.rollouts import RolloutSource, live_source, traffic_source
from specopd_trainer.algorithms.draft_opd.versions import VersionLedger, drop_stale, serving_version
from specopd_trainer.algorithms.registry import PushFn, ShardingRefusedError
from specopd_trainer.loops.common import dist_info, step_generator
from specopd_trainer.loops.counters import Counters
from specopd_trainer.loops.engine import run_training
from specopd_trainer.loops.parallel import pushable, wrap

LIVE_ATTEMPTS = 3  # rollout rounds per step before a live run gives up on finding blocks to replay
TRAFFIC_POLL_S = 2.0


def make_source(client, prompts: Sequence[List[int]], cfg: DraftOPDConfig, block_size: int, rank: int = 0,
                world: int = 1) -> RolloutSource:
    """The rollout source ``cfg`` asks for: recorded traffic (``from_traffic``) or live rollouts of ``prompts``
    (this rank's share of each step's draw)."""
    if cfg.from_traffic:
        return traffic_source(client, block_size=block_size, max_items=cfg.traffic_items, purge=cfg.purge_traffic)
    return live_source(client, prompts, block_size=block_size, rollout_prompts=cfg.rollout_prompts,
                       max_new_tokens=cfg.rollout_tokens, temperature=cfg.temperature, concurrency=cfg.concurrency,
                       share=(rank, world))


def train_draft_opd(drafter, client, prompts: Sequence[List[int]], run_dir: str | Path, cfg: DraftOPDConfig, *,
                    push: PushFn, progress: bool = True, source: Optional[RolloutSource] = None,
                    sleep=time.sleep) -> dict:
    """Draft-OPD: per step optionally push (``push(step, drafter)``, every ``cfg.push_every`` steps), collect
    rollouts from ``source`` (default :func:`make_source`), drop stale records, replay the selected blocks and
    train; push once more at the end. ``prompts``: token-id lists (live mode). ``sleep``: the traffic poll's wait.

    Under ``torchrun`` (DDP or FSDP2, ``cfg.parallel``; :mod:`.ranks`) each rank rolls out its share of the step's
    prompts and replays its own blocks; rank 0 pushes. Returns the engine summary plus ``supervised_tokens``,
    ``supervised_tokens_per_s``, ``start_step``, ``pushed`` (steps pushed by this call) and ``versions`` (the
    ledger). Raises ValueError without prompts in live mode, or when a step finds no block to replay (live: after
    ``LIVE_ATTEMPTS`` rollout rounds; traffic: after ``cfg.traffic_wait_s`` seconds; under torchrun on any rank);
    :class:`ShardingRefusedError` under torchrun with ``from_traffic`` or fewer ``rollout_prompts`` than ranks.
    """
    rank, world = dist_info()
    if world > 1 and cfg.from_traffic:
        raise ShardingRefusedError("Draft-OPD --from-traffic reads the server's one traffic cursor: run it in a "
                                   "single process (not under torchrun)")
    if world > 1 and cfg.rollout_prompts < world:
        raise ShardingRefusedError(f"Draft-OPD under torchrun splits each step's rollout prompts across ranks: "
                                   f"rollout_prompts ({cfg.rollout_prompts}) must be at least the {world} ranks")
    if not cfg.from_traffic and not prompts and source is None:
        raise ValueError("no prompts")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    g = drafter.block_size - 1
    source = source or make_source(client, prompts, cfg, drafter.block_size, rank, world)
    module = wrap(ReplayStep(drafter, client, cfg, list(drafter.spec.target_layer_ids)), cfg.parallel, world,
                  broadcast_buffers=False)
    counters = Counters(run_dir, cfg.ckpt_every, rank)
    ledger = VersionLedger(run_dir, counters.start_step, write=rank == 0)
    if world == 1:
        ledger.note(counters.start_step - 1, serving_version(client))
    else:  # rank 0's view, before any rank can push
        ledger.note(counters.start_step - 1, broadcast_version(serving_version(client) if rank == 0 else None))
    pushed: List[int] = []

    def do_push(step: int) -> None:  # collective under torchrun: every rank calls it at the same steps
        view = pushable(drafter)
        version = None
        if rank == 0:
            version = push(step, view)
            version = version if isinstance(version, str) else serving_version(client)
        ledger.note(step, broadcast_version(version) if world > 1 else version)
        pushed.append(step)

    def gather(gen: torch.Generator):
        dropped = {"stale_records": 0, "unknown_version_records": 0}
        deadline, attempts, rollout_tokens = time.monotonic() + cfg.traffic_wait_s, 0, 0
        while True:
            error = rollouts = None
            try:
                rollouts, counts = drop_stale(source(gen), ledger, cfg.max_staleness, cfg.keep_unknown_versions)
            except ValueError as exc:
                error = exc
            if world > 1:
                agree_or_raise(error)  # every rank stops, or none
            elif error is not None:
                raise error
            attempts += 1
            for k in dropped:
                dropped[k] += counts[k]
            rollout_tokens += sum(len(r.token_ids) - r.prompt_len for r in rollouts)
            selected = select_blocks(rollouts, g, cfg.anchors, cfg.max_blocks, gen)
            found = len(selected) if world == 1 else all_sum(len(selected))  # blocks on all ranks
            if found:
                return rollouts, selected, dropped, rollout_tokens, found
            if not cfg.from_traffic and attempts >= LIVE_ATTEMPTS:
                raise ValueError(f"no {cfg.anchors}-anchor blocks to replay in {attempts} rounds of rollouts "
                                 f"(dropped: {dropped}; is the server speculative?)")
            if cfg.from_traffic:
                if time.monotonic() >= deadline:
                    raise ValueError(f"no usable traffic within {cfg.traffic_wait_s:g} s (dropped: {dropped})")
                if not getattr(source, "backlog", 0):  # nothing recorded and unread: wait for new traffic
                    sleep(TRAFFIC_POLL_S)

    def step_fn(step: int, gen: torch.Generator):
        if cfg.push_every and step % cfg.push_every == 0:
            do_push(step)
        t0 = time.monotonic()
        # under torchrun: the single-process draw of prompts (rank-0 generator), this rank's share
        rollouts, selected, dropped, rollout_tokens, found = gather(gen if world == 1 else
                                                                    step_generator(cfg.seed, step, 0))
        rollout_s = time.monotonic() - t0
        loss, m = module(selected)
        weight = world * m["blocks"] / found  # ranks weigh by their blocks (a rank may have none this step)
        (loss * weight).backward()
        out = {**rollout_stats(rollouts, g), **dropped, **m, "rollout_tokens": rollout_tokens, "rollout_s": rollout_s,
               "loss": float(loss.item()) * weight}
        if world > 1:
            out = reduce_metrics(out, world)
        value = out.pop("loss")
        out.update(counters.add(step + 1, int(out["step_supervised_tokens"])))
        return value, out

    summary = run_training(drafter, step_fn, run_dir, steps=cfg.steps, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                           min_lr_ratio=cfg.min_lr_ratio, grad_clip=cfg.grad_clip, seed=cfg.seed,
                           log_every=cfg.log_every, ckpt_every=cfg.ckpt_every, max_minutes=cfg.max_minutes,
                           config=cfg.model_dump(), desc="Draft-OPD", progress=progress)
    if not pushed or pushed[-1] != summary["steps"]:
        do_push(summary["steps"])
    summary.update(supervised_tokens=counters.tokens, supervised_tokens_per_s=counters.tokens / max(counters.wall(),
                   1e-9), start_step=counters.start_step, pushed=pushed, versions=ledger.versions)
    return summary
