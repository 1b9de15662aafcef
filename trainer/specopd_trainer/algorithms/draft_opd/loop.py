"""Draft-OPD against a live server on the shared engine (single process).

One step: push the drafter every ``push_every`` steps (before the step's rollouts, so they are on-policy), get
rollouts from the source (live prompts or recorded traffic, :mod:`.rollouts`), drop stale records
(:mod:`.versions`), select the blocks to replay (error anchors or random ones), and train on them
(:func:`.replay.draft_opd_step`, or :func:`.replay.sft_step` without replay). Metrics per step: loss, served
acceptance statistics of the fresh records (``rollout_tau``, ``accepted_per_slot``, ``rejected_per_slot``),
replayed ``blocks`` / ``accepted_tokens`` / ``rejected_tokens``, ``est_tau``, ``stale_records``,
``unknown_version_records``, and the cumulative ``supervised_tokens`` / ``supervised_tokens_per_s``
(:mod:`specopd_trainer.loops.counters`, kept across resumes).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from specopd_trainer.algorithms.draft_opd.config import DraftOPDConfig
from specopd_trainer.algorithms.draft_opd.replay import draft_opd_step, rollout_stats, select_blocks, sft_step
from specopd_trainer.algorithms.draft_opd.rollouts import RolloutSource, live_source, traffic_source
from specopd_trainer.algorithms.draft_opd.versions import VersionLedger, drop_stale, serving_version
from specopd_trainer.algorithms.registry import PushFn
from specopd_trainer.loops.common import dist_info
from specopd_trainer.loops.counters import Counters
from specopd_trainer.loops.engine import run_training

LIVE_ATTEMPTS = 3  # rollout rounds per step before a live run gives up on finding blocks to replay
TRAFFIC_POLL_S = 2.0


def make_source(client, prompts: Sequence[List[int]], cfg: DraftOPDConfig, block_size: int) -> RolloutSource:
    """The rollout source ``cfg`` asks for: recorded traffic (``from_traffic``) or live rollouts of ``prompts``."""
    if cfg.from_traffic:
        return traffic_source(client, block_size=block_size, max_items=cfg.traffic_items, purge=cfg.purge_traffic)
    return live_source(client, prompts, block_size=block_size, rollout_prompts=cfg.rollout_prompts,
                       max_new_tokens=cfg.rollout_tokens, temperature=cfg.temperature, concurrency=cfg.concurrency)


def train_draft_opd(drafter, client, prompts: Sequence[List[int]], run_dir: str | Path, cfg: DraftOPDConfig, *,
                    push: PushFn, progress: bool = True, source: Optional[RolloutSource] = None,
                    sleep=time.sleep) -> dict:
    """Draft-OPD: per step optionally push (``push(step, drafter)``, every ``cfg.push_every`` steps), collect
    rollouts from ``source`` (default :func:`make_source`), drop stale records, replay the selected blocks and
    train; push once more at the end. ``prompts``: token-id lists (live mode). ``sleep``: the traffic poll's wait.

    Single process. Returns the engine summary plus ``supervised_tokens``, ``supervised_tokens_per_s``,
    ``start_step``, ``pushed`` (steps pushed by this call) and ``versions`` (the ledger). Raises ValueError under
    torchrun, without prompts in live mode, or when a step finds no block to replay (live: after
    ``LIVE_ATTEMPTS`` rollout rounds; traffic: after ``cfg.traffic_wait_s`` seconds).
    """
    rank, world = dist_info()
    if world > 1:
        raise ValueError("Draft-OPD runs in a single process (its rollouts come from the pushed drafter)")
    if not cfg.from_traffic and not prompts and source is None:
        raise ValueError("no prompts")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    layer_ids = list(drafter.spec.target_layer_ids)
    g = drafter.block_size - 1
    source = source or make_source(client, prompts, cfg, drafter.block_size)
    counters = Counters(run_dir, cfg.ckpt_every, rank)
    ledger = VersionLedger(run_dir, counters.start_step)
    ledger.note(counters.start_step - 1, serving_version(client))
    pushed: List[int] = []

    def do_push(step: int) -> None:
        version = push(step, drafter)
        ledger.note(step, version if isinstance(version, str) else serving_version(client))
        pushed.append(step)

    def gather(gen: torch.Generator):
        dropped = {"stale_records": 0, "unknown_version_records": 0}
        deadline, attempts, rollout_tokens = time.monotonic() + cfg.traffic_wait_s, 0, 0
        while True:
            rollouts, counts = drop_stale(source(gen), ledger, cfg.max_staleness, cfg.keep_unknown_versions)
            attempts += 1
            for k in dropped:
                dropped[k] += counts[k]
            rollout_tokens += sum(len(r.token_ids) - r.prompt_len for r in rollouts)
            selected = select_blocks(rollouts, g, cfg.anchors, cfg.max_blocks, gen)
            if selected:
                return rollouts, selected, dropped, rollout_tokens
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
        rollouts, selected, dropped, rollout_tokens = gather(gen)
        rollout_s = time.monotonic() - t0
        if cfg.replay:
            loss, m = draft_opd_step(drafter, client, selected, layer_ids, loss=cfg.loss, gamma=cfg.gamma,
                                     lambda_acc=cfg.lambda_acc, lambda_rej=cfg.lambda_rej, head_dtype=cfg.head_dtype,
                                     rejected_slots=cfg.rejected_slots)
        else:
            loss, m = sft_step(drafter, client, selected, layer_ids, gamma_decay=cfg.sft_gamma_decay)
        loss.backward()
        out = {**rollout_stats(rollouts, g), **dropped, **m, "rollout_tokens": rollout_tokens, "rollout_s": rollout_s}
        out.update(counters.add(step + 1, int(m["step_supervised_tokens"])))
        return float(loss.item()), out

    summary = run_training(drafter, step_fn, run_dir, steps=cfg.steps, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                           min_lr_ratio=cfg.min_lr_ratio, grad_clip=cfg.grad_clip, seed=cfg.seed,
                           log_every=cfg.log_every, ckpt_every=cfg.ckpt_every, max_minutes=cfg.max_minutes,
                           config=cfg.model_dump(), desc="Draft-OPD", progress=progress)
    if not pushed or pushed[-1] != summary["steps"]:
        do_push(summary["steps"])
    summary.update(supervised_tokens=counters.tokens, supervised_tokens_per_s=counters.tokens / max(counters.wall(),
                   1e-9), start_step=counters.start_step, pushed=pushed, versions=ledger.versions)
    return summary
