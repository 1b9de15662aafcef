"""Train one arm of the comparison from the start drafter against the live server, redeploy it hot, measure it.

Every arm trains a copy of the start drafter with the project's own loops (``train_sft``, ``train_specopd``,
``train_sequential_opd``, ``train_draft_opd``), is pushed into the ONE server through the admin hot-swap route
(``specopd_trainer.pipeline.push_drafter``) and evaluated there on the same held-out prompts at T=0 and T=1
(SGLang's per-request statistics, ``specopd_trainer.evaluate.evaluate_acceptance``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from draft_opd_compare.arms import (BASELINE, DRAFT_OPD_ARMS, EQUAL_STEPS_ARMS, SEQUENTIAL_TAU, START,
                                    budget_fraction, draft_opd_config, sequential_config, specopd_recipe_config)


MAX_TOPUPS = 3  # resumptions of a rollout arm whose steps supervised fewer tokens than planned


class BudgetReached(Exception):
    """A rollout arm starts a step with its supervised-token budget already spent."""


@dataclass
class Session:
    """What every arm shares: the server (url, admin key, client), the target tokenizer, the start drafter
    (``base``, never trained in place), training sequences (target references with features) and their prompts
    (token-id lists, the rollout arms'), the budget, options (``args`` of the script) and the run directory."""

    url: str
    admin_key: str
    client: Any
    tok: Any
    base: Any
    train_seqs: Sequence
    prompts: Sequence[List[int]]
    budget_tokens: int
    args: Any
    run_dir: Path
    domains: Sequence[str] = ("dialogue", "coding", "math", "agentic")
    start_tau: Optional[float] = None  # the start's served T1 tau (sft_start's evaluation), when measured
    log: Callable[[str], None] = field(default=lambda msg: print(msg, file=sys.stderr, flush=True))


def counted_tokens(run_dir: Path) -> int:
    """Supervised tokens the loop in ``run_dir`` has counted so far (its ``counters.json``, latest step; 0 if
    none)."""
    path = Path(run_dir) / "counters.json"
    if not path.is_file():
        return 0
    table = json.loads(path.read_text())
    return int(table[max(table, key=int)]["supervised_tokens"]) if table else 0


def pooled_tau(per_request: Sequence[dict]) -> Optional[float]:
    """Sum of completion tokens over sum of verify steps of ``per_request`` rows (None without verify steps)."""
    verify = sum(int(r["verify_steps"]) for r in per_request)
    return sum(int(r["completion_tokens"]) for r in per_request) / verify if verify else None


def budget_push(s: Session, arm: str, run_dir: Path, enforce: bool = True) -> Callable[[int, Any], str]:
    """``push(step, drafter)`` for a rollout arm: raises :class:`BudgetReached` once ``run_dir``'s counters reach
    the budget (the loops push at the start of a step, so the stop falls between steps; never with ``enforce``
    False), else hot-swaps the drafter as version ``<arm>-step<N>`` and returns that version."""
    from specopd_trainer.pipeline import push_drafter

    def push(step: int, drafter) -> str:
        if enforce and counted_tokens(run_dir) >= s.budget_tokens:
            raise BudgetReached
        version = f"{arm}-step{step}"
        push_drafter(s.url, drafter, version, s.admin_key)
        return version

    return push


def last_metrics(run_dir: Path) -> Dict[str, Any]:
    """The last row of ``run_dir/metrics.jsonl`` ({} when there is none yet)."""
    path = Path(run_dir) / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return json.loads(lines[-1]) if lines else {}


@contextlib.contextmanager
def periodic(fn: Callable[[], None], every_s: float, name: str = "periodic"):
    """While the block runs, call ``fn()`` every ``every_s`` seconds from a daemon thread (stopped and joined on
    exit)."""
    stop = threading.Event()

    def loop():
        while not stop.wait(every_s):
            fn()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def ticker(s: Session, arm: str, run_dir: Path, every_s: float = 60.0):
    """While the block runs, log every ``every_s`` seconds the arm's last logged step and supervised tokens
    (``run_dir/metrics.jsonl``, last row) to stderr."""
    t0 = time.monotonic()

    def tick():
        row = last_metrics(run_dir)
        s.log(f"[{arm}] {time.monotonic() - t0:.0f} s: step {row.get('step', 0)}, supervised tokens "
              f"{row.get('supervised_tokens', '-')} / {s.budget_tokens}, loss {row.get('loss', '-')}")

    return periodic(tick, every_s, f"ticker-{arm}")


def evaluate_per_request(s: Session) -> Dict[str, List[dict]]:
    """The served drafter on the held-out prompts (``--eval-limit`` per domain; with ``--eval-split validation``
    the train-split prompts ``[--val-offset, --val-offset + --eval-limit)`` instead) at T=0 and T=1: {T0, T1:
    ``per_request`` rows (id, domain, completion_tokens, verify_steps, ...)}."""
    from specopd_trainer.evaluate import evaluate_acceptance
    from specopd_trainer.pipeline import train_split_records

    records = None  # the eval split
    if getattr(s.args, "eval_split", "eval") == "validation":
        records = {d: train_split_records(s.args.val_offset, s.args.eval_limit, [d]) for d in s.domains}
    out = {}
    for temp, key in ((0.0, "T0"), (1.0, "T1")):
        res = evaluate_acceptance(s.url, s.tok, s.domains, temperature=temp, limit=s.args.eval_limit,
                                  max_new_tokens=s.args.eval_max_new_tokens, concurrency=s.args.eval_concurrency,
                                  records=records, progress=False)
        out[key] = res["per_request"]
        s.log(f"  {key}: tau {json.dumps({d: round(v, 3) for d, v in res['tau'].items() if v is not None})} "
              f"mean {res['mean_tau']:.3f}")
    return out


def _train(s: Session, arm: str, drafter, run_dir: Path) -> Dict[str, Any]:
    """Train ``drafter`` in place as ``arm``; returns {supervised_tokens, steps, config, stopped_at_budget}."""
    g = drafter.block_size - 1
    a = s.args
    if arm == BASELINE:
        from specopd_smollm2.run import continued_sft_config
        from specopd_trainer.algorithms.sft.loop import train_sft

        cfg, tokens = continued_sft_config(s.budget_tokens, g, a.lr_sft)
        summary = train_sft(drafter, list(s.train_seqs), [], run_dir, cfg, progress=False)
        return {"supervised_tokens": tokens, "steps": summary["steps"], "config": cfg.model_dump()}
    if arm == "specopd":
        from specopd_trainer.algorithms.specopd.loop import train_specopd

        cfg = specopd_recipe_config(s.budget_tokens, g, lr=getattr(a, "lr_specopd", None))
        s.client.prefix_cache(clear=True)
        summary = train_specopd(drafter, s.client, list(s.train_seqs), run_dir, cfg, progress=False)
        return {"supervised_tokens": summary["supervised_tokens"], "steps": summary["steps"],
                "config": cfg.model_dump()}
    equal_steps = arm in EQUAL_STEPS_ARMS  # the step count of another arm, not the token budget
    push = budget_push(s, arm, run_dir, enforce=not equal_steps)
    if arm == "sequential_opd":
        from specopd_trainer.algorithms.sequential_opd.loop import train_sequential_opd as loop

        cfg = sequential_config(s.budget_tokens, g, rollout_prompts=a.rollout_prompts,
                                rollout_tokens=a.rollout_tokens, lr=a.lr_opd, tau=s.start_tau or SEQUENTIAL_TAU)
    elif arm in DRAFT_OPD_ARMS:
        from specopd_trainer.algorithms.draft_opd.loop import train_draft_opd as loop

        cfg = draft_opd_config(arm, s.budget_tokens, g, rollout_prompts=a.rollout_prompts,
                               rollout_tokens=a.rollout_tokens, max_blocks=a.max_blocks, lr=a.lr_opd)
    else:
        raise KeyError(f"no training for arm {arm!r}")
    s.client.prefix_cache(clear=True)
    stopped, topups, steps, planned = False, 0, 0, cfg.steps
    while True:
        try:
            steps = loop(drafter, s.client, list(s.prompts), run_dir, cfg, push=push, progress=False)["steps"]
        except BudgetReached:
            stopped = True
            steps = len((run_dir / "metrics.jsonl").read_text().splitlines())  # log_every 1: a row per step
            break
        tokens = counted_tokens(run_dir)
        if equal_steps or tokens >= s.budget_tokens or topups >= MAX_TOPUPS or tokens == 0:
            break
        # fewer tokens per step than planned: resume the run (exact resume from its last checkpoint) for the
        # steps the remaining budget needs at the rate observed so far (at most the planned count again); the LR
        # schedule spans the new total
        topups += 1
        extra = min(planned, math.ceil((s.budget_tokens - tokens) / (tokens / steps)))
        s.log(f"[{arm}] {tokens} / {s.budget_tokens} supervised tokens after {steps} steps: top-up {topups} of "
              f"{extra} steps")
        cfg = cfg.model_copy(update={"steps": steps + extra})
    out = {"supervised_tokens": counted_tokens(run_dir), "steps": steps, "config": cfg.model_dump(),
           "stopped_at_budget": stopped, "topups": topups}
    if arm == "sequential_opd":
        out["tau_assumed"] = s.start_tau or SEQUENTIAL_TAU
    if equal_steps:
        out["steps_of"] = EQUAL_STEPS_ARMS[arm]
    return out


def run_arm(s: Session, arm: str) -> Dict[str, Any]:
    """Train ``arm`` from a copy of the start drafter (fresh: an interrupted arm's run directory is removed
    first), save it to ``RUN/drafter-<arm>``, push it hot and evaluate it. ``sft_start`` trains nothing (the start
    is pushed back and evaluated). Returns the arm's result (``per_request`` {T0, T1}, supervised_tokens,
    wall_s, budget_fraction, steps, config, version)."""
    from specopd_trainer.pipeline import push_drafter

    drafter = copy.deepcopy(s.base)
    run_dir = s.run_dir / arm
    shutil.rmtree(run_dir, ignore_errors=True)  # arms restart, they do not resume (a benchmark starts fresh)
    s.log(f"[{arm}] training (budget {s.budget_tokens} supervised tokens)")
    t0 = time.monotonic()
    if arm == START:
        trained = {"supervised_tokens": 0, "steps": 0, "config": None}
    else:
        with ticker(s, arm, run_dir, s.args.progress_every_s):
            trained = _train(s, arm, drafter, run_dir)
    wall = time.monotonic() - t0
    if arm != START:
        drafter.save_pretrained(s.run_dir / f"drafter-{arm}", overwrite=True)
    version = f"{arm}-final"
    push_drafter(s.url, drafter, version, s.admin_key)
    fraction = budget_fraction(trained["supervised_tokens"], s.budget_tokens) if arm != START else None
    s.log(f"[{arm}] {trained['supervised_tokens']} supervised tokens in {wall:.0f} s, {trained['steps']} steps; "
          f"pushed {version}, evaluating")
    if fraction is not None and arm not in EQUAL_STEPS_ARMS and not 0.95 <= fraction <= 1.05:
        s.log(f"[{arm}] WARNING: {fraction:.2f} x the budget (steps too few or too full for it; see arms.py)")
    per_request = evaluate_per_request(s)
    return {**trained, "wall_s": wall if arm != START else None, "version": version, "per_request": per_request,
            "budget_fraction": fraction}
