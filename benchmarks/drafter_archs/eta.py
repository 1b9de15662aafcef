"""Progress lines with an ETA for the whole run: each unfinished phase's expected wall time.

A phase's estimate (seconds) starts from the defaults below (measured on the 2-core AMD EPYC machine, see the
script's docstring) and is rescaled by how the phases finished so far compared with their own defaults (the
median ratio), so a slower or busier machine stretches every later estimate alike. While a training phase runs,
its own rate (seconds per step so far, from its ``metrics.jsonl``) replaces the estimate of its remaining steps.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from drafter_archs.store import EVAL_PHASES, PHASES

# Seconds per optimiser step, measured by a smoke run of this script on SmolLM2 (runs/drafter_archs_smoke: 8 SFT
# steps, 6 SpecOPD steps per architecture, the real SFT data and references, score_trees_budget_tokens 0, nothing
# else running; steady steps, the first left out). SFT (8 sequences x 16 anchors x 7 slots): DFlash 3.73, V2 3.76,
# DSpark 3.98 s. SpecOPD (the recipe: 2 x (8 anchors x 7 branches + 64 roots) = 912 supervised tokens, server
# scoring included): DFlash 9.0, V2 12.2, DSpark 10.5 s.
SFT_S_PER_STEP = {"dflash": 3.75, "dflash2": 3.8, "dspark": 4.0}
SPECOPD_S_PER_STEP = {"dflash": 9.0, "dflash2": 12.2, "dspark": 10.5}
# Output tokens/s of the SPECOPD server over the held-out prompts at the evaluation's concurrency 8 (T0 and T1):
# 17.5 with the reference drafter at tau 1.73 (concurrency_reference_smollm2_cpu.json), scaled to tau ~1.2
EVAL_TOKENS_PER_S = 12.0
# output tokens/s at concurrency (speculative, plain): concurrency_reference_smollm2_cpu.json's T0 levels, the
# speculative ones scaled from its tau 1.73 to ~1.2
SERVE_TOKENS_PER_S = {1: (5.0, 11.2), 2: (7.6, 13.8), 4: (10.2, 22.3), 8: (12.1, 27.3)}
SERVER_START_S = 90.0  # SGLang on SmolLM2 to healthy: 77-89 s in the smoke run
# the data, once per run directory: a plain server, then the context features of the 400 SFT sequences (200,192
# tokens at ~300 tok/s with score_trees_budget_tokens 0)
DATA_S = SERVER_START_S + 200192 / 300.0


def steps_of(phase: str, args) -> int:
    """Optimiser steps of a training phase at the run's budget (SFT: 8 sequences x 16 anchors x G per step,
    SpecOPD: the recipe's 2 x (8 x 7 x G + 64)), G = block size - 1 of the reference sizes (``args.block_size``)."""
    g = args.block_size - 1
    if phase == "sft":
        return max(1, math.ceil(args.sft_tokens / (args.sft_seqs_per_step * args.sft_anchors_per_seq * g)))
    return max(1, round(args.opd_tokens / (2 * (8 * 7 * g + 64))))


def default_s(phase: str, arch: str, args) -> float:
    """The uncalibrated estimate of one phase (seconds)."""
    n = len(args.domains) * args.eval_limit * args.eval_max_new_tokens
    if phase == "init":
        return 10.0
    if phase == "sft":
        return steps_of("sft", args) * SFT_S_PER_STEP.get(arch, 3.5)
    if phase == "specopd":
        return steps_of("specopd", args) * SPECOPD_S_PER_STEP.get(arch, 11.0)
    if phase in EVAL_PHASES:
        return SERVER_START_S / 2 + 2 * n / EVAL_TOKENS_PER_S
    m = len(args.domains) * args.serve_limit * args.serve_max_new_tokens
    rates = [SERVE_TOKENS_PER_S.get(c, SERVE_TOKENS_PER_S[4]) for c in args.serve_levels]
    return 2 * SERVER_START_S + sum(m / s + m / p for s, p in rates)


def calibration(done: Mapping[str, Mapping[str, Mapping[str, Any]]], args) -> float:
    """Median of measured / default wall time over the finished phases that recorded one (1.0 without any)."""
    ratios = [r["wall_s"] / default_s(p, a, args) for a, phases in done.items() for p, r in phases.items()
              if p != "init" and r.get("wall_s") and not r.get("restored")]
    return statistics.median(ratios) if ratios else 1.0


def remaining_s(archs: Sequence[str], done: Mapping[str, Mapping[str, Any]], args,
                skip: Optional[tuple] = None) -> float:
    """Expected seconds of every unfinished phase of ``archs`` (``skip``: an (arch, phase) left out, the one whose
    own rate is being reported), plus :data:`DATA_S` while no SFT has finished; without the serving phase under
``--no-serve``."""
    k = calibration(done, args)
    data = 0.0 if any("sft" in phases for phases in done.values()) else DATA_S  # no SFT yet: the data is not built
    phases = [p for p in PHASES if p != "serve" or not getattr(args, "no_serve", False)]
    return data + sum(k * default_s(p, a, args) for a in archs for p in phases
                      if p not in done.get(a, {}) and (a, p) != skip)


def clock(seconds: float) -> str:
    """``"1 h 05 min (done ~18:40 UTC)"``."""
    m = int(round(seconds / 60))
    span = f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{m} min"
    return f"{span} (done ~{time.strftime('%H:%M', time.gmtime(time.time() + seconds))} UTC)"


def training_ticker(log: Callable[[str], None], label: str, run_dir: Path, total_steps: int,
                    rest_s: Callable[[], float], every_s: float = 60.0):
    """A context manager: while its block runs, every ``every_s`` seconds log the training run's last logged step
    of ``total_steps``, seconds per step (cumulative wall time over steps, resumes included), this phase's ETA and
    the whole run's (``rest_s()``: the other unfinished phases)."""
    from draft_opd_compare.train import last_metrics, periodic

    def tick():
        row = last_metrics(run_dir)
        step, wall = int(row.get("step", 0)), float(row.get("wall_s", 0.0))
        if step <= 0:
            log(f"[{label}] starting ({total_steps} steps)")
            return
        per = wall / step
        left = per * max(0, total_steps - step)
        loss = float(row.get("loss", float("nan")))
        log(f"[{label}] step {step} / {total_steps}, {per:.1f} s/step, loss {loss:.3f}; phase {clock(left)};"
            f" whole run {clock(left + rest_s())}")

    return periodic(tick, every_s, f"ticker-{label}")
