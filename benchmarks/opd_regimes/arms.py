"""One arm of a regime: a copy of the snapshot trained with the arm's adapt step on the snapshot's frozen buffers
(nothing more is read from the spool), its counters, then served tau of what it learned.

Counters: ``supervised_tokens`` (the adapter's trained draft positions), ``drafter_rows`` (positions through the
drafter's layers: every ``forward_hidden`` block row, branches and retention included), ``target_rows`` (rows the
target scored for the arm through ``score_trees``: proposal-tree nodes; 0 for SFT, whose context features came with
the served traffic). Budgets: ``wall`` (continued SFT trains ``arm_minutes``, every other arm until the same wall
time: ``max_minutes`` = SFT's measured wall_s) or ``traffic`` (each arm judged every ``eval_every`` steps and stopped
when its held-out gain flattens, or at ``arm_max_steps``). During an arm nothing is pushed (the server keeps serving
the snapshot drafter, whose verify records Draft-OPD replays); afterwards the arm's drafter is pushed and measured.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Dict, Tuple

import torch

from opd_regimes.plateau import SNAPSHOT_VERSION, make_adapter, plateaued, run_until
from opd_regimes.regimes import BASELINE, arm_setup


class CountingClient:
    """The server client with the target-scored rows of every ``score_trees`` call counted (``rows``)."""

    def __init__(self, client):
        self._client, self.rows = client, 0

    def score_trees(self, req):
        out = self._client.score_trees(req)
        self.rows += sum(int(r.num_nodes) for r in out)
        return out

    def __getattr__(self, name):
        return getattr(self._client, name)


def count_drafter_rows(drafter) -> Dict[str, int]:
    """Wrap ``drafter.forward_hidden`` (every architecture's block forward) to count its block rows."""
    box = {"rows": 0}
    inner = drafter.forward_hidden

    def forward_hidden(block_ids, *a, **kw):
        box["rows"] += int(block_ids.numel())
        return inner(block_ids, *a, **kw)

    drafter.forward_hidden = forward_hidden
    return box


def t0_chain_step(ctx, sizes: Dict[str, int]):
    """The ``t0_chain`` arm's adapt step: SFT's sampling of served requests and anchors, loss ``t0_chain_ce`` (hard
    CE towards the served tokens, each slot weighted by the drafter's argmax chain reaching it)."""
    from specopd_kernels.losses import get_loss
    from specopd_trainer.algorithms.registry import NothingToTrain
    from specopd_trainer.loops.common import sample_anchors

    loss_fn = get_loss("t0_chain_ce")
    g = ctx.drafter.block_size - 1

    def step(gen: torch.Generator) -> Tuple[float, Dict[str, Any]]:
        train = ctx.train
        if not train:
            raise NothingToTrain("no training traffic")
        picks = torch.randint(len(train), (sizes["seqs"],), generator=gen).tolist()
        total, tokens = 0.0, 0
        for i in picks:
            s = train[i]
            anchors = sample_anchors(s.prompt_len, len(s.token_ids), sizes["anchors"], gen)
            if not anchors.numel():
                continue
            logits, labels = ctx.drafter.logits(s.features.float(), s.token_ids, anchors)
            loss = loss_fn(logits[:, 1:], labels[:, 1:]) / len(picks)
            loss.backward()
            total, tokens = total + float(loss.item()), tokens + int(anchors.numel()) * g
        return total, {"supervised_tokens": tokens}

    return step


def arm_dir(run_dir: Path, arm: str, seed: int) -> Path:
    return run_dir / "arms" / f"{arm}.seed{seed}"


def run_arm(env, regime, arm: str, seed: int, snap: Path, s: Dict[str, Any], run_dir: Path,
            baseline_wall_s: float | None) -> Dict[str, Any]:
    """Train ``arm`` (seed ``seed``) from ``snap``; returns its record (also kept in its run dir: ``arm.json``)."""
    from specopd_trainer.algorithms.registry import AdaptContext
    from specopd_trainer.adapt.view import TrainView

    d = arm_dir(run_dir, arm, seed)
    done = d / "arm.json"
    if done.is_file():
        return json.loads(done.read_text())
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(snap, d)
    algorithm, options = arm_setup(arm, regime.temperature, s["sizes"])
    client = CountingClient(env.client)
    drafter = env.load_drafter()
    rows = count_drafter_rows(drafter)
    traffic = regime.budget == "traffic"
    if traffic:
        over = {"max_steps": None, "eval_every": s["eval_every"]}
    elif arm == BASELINE:
        over = {"max_minutes": s["arm_minutes"], "eval_every": 10**9}
    else:
        over = {"max_minutes": baseline_wall_s / 60.0, "eval_every": 10**9}
    ad = make_adapter(client, drafter, d, algorithm, options, {**s, "seed": seed}, seed=seed,
                      push=lambda dr, v: None, serving_version=lambda: None, **over)
    step0 = ad.state.step  # the snapshot's steps; the arm's own are counted from here
    ad.ingest = lambda: 0  # frozen buffers: the snapshot's traffic only
    ad.fresh_versions = lambda: {SNAPSHOT_VERSION}  # Draft-OPD replays the snapshot drafter's records
    ad.step_fn = ad._make_step(ad.algorithm)  # its context sees the frozen versions above
    if arm == "t0_chain":
        ad.step_fn = t0_chain_step(AdaptContext(drafter=drafter, client=client, train=TrainView(ad),
                                                fresh_versions=ad.fresh_versions, anchor=ad.anchor, retain=0.0),
                                   s["sizes"])
    tokens0 = ad.state.trained_tokens
    t0 = time.monotonic()
    if traffic:
        cap = s["arm_max_steps"]
        out = run_until(ad, lambda: "flattened" if plateaued(ad, s["plateau_verdicts"], s["plateau_gain"])
                        else ("step cap" if ad.state.step - step0 >= cap else None), poll_s=0.2)
        stopped = out.get("stopped_by")
        ad.drafter.load_state_dict(ad.deployed.state_dict())  # what its guard kept
    else:
        stopped = ad.run().get("stopped_by")
    wall = time.monotonic() - t0
    env.push(ad.drafter, f"opd-regimes-{regime.name}-{arm}-s{seed}")
    measured = env.measure(regime, tag=f"s{seed}:")
    env.push(env.load_snapshot_drafter(snap), SNAPSHOT_VERSION)  # the next arm's records come from the snapshot
    rec = {"arm": arm, "seed": seed, "algorithm": algorithm, "options": options, "wall_s": round(wall, 2),
           "steps": ad.state.step - step0, "stopped_by": stopped, "drafter_rows": rows["rows"], "target_rows": client.rows,
           "supervised_tokens": int(ad.state.trained_tokens - tokens0), "per_request": measured}
    done.write_text(json.dumps(rec) + "\n")
    return rec
