"""The SFT-from-traffic phase of a regime: the regime's traffic served at its temperature while ``specopd adapt
--algorithm sft`` learns from it, until SFT has plateaued; then the snapshot every arm starts from.

**Plateau**: the last ``plateau_verdicts`` (N) held-out judgements of the candidate (the guard's greedy walk over the
newest held-out requests, candidate - deployed tau) all gained less than ``plateau_gain``
(:func:`specopd_trainer.adapt.auto.flattened`, the rule ``--algorithm auto`` switches on), or the step cap, or the
minutes cap. **Snapshot**: the snapshot drafter is pushed and serves ``record_requests`` more train-split prompts (so
the frozen buffer holds verify records of the snapshot drafter for Draft-OPD), they are read in, and the adapter's
run directory (drafter, optimiser state, deployed / start weights, frozen train, held-out and rehearsal buffers) is
copied to ``snapshot/``. A finished snapshot (``snapshot/plateau.json``) is reused by a rerun.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

SNAPSHOT_VERSION = "opd-regimes-snapshot"


def make_adapter(client, drafter, run_dir: Path, algorithm: str, options: Dict[str, Any], s: Dict[str, Any], *,
                 push: Callable, serving_version: Callable[[], Optional[str]], **over):
    """An :class:`~specopd_trainer.adapt.loop.Adapter` with the benchmark's settings (``s``)."""
    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.adapt.loop import Adapter

    cfg = AdaptConfig(**{"algorithm": algorithm, "algorithm_options": options, "lr": s["lr"], "start_at": s.get("start_at", "newest"),
                         "eval_every": s["eval_every"], "min_holdout": s["min_holdout"],
                         "holdout_window": s["holdout_window"], "min_train_tokens": s["min_train_tokens"],
                         "rehearsal": s["rehearsal"], "retain": 0.0, "log_every_s": 60.0,
                         "serving_temperature": s["temperature"], "max_staleness": 10**6, **over})
    return Adapter(client, drafter, run_dir, cfg, push=push, serving_version=serving_version, progress=False)


def plateaued(adapter, n: int, gain: float) -> bool:
    from specopd_trainer.adapt.auto import flattened

    return flattened(adapter.state.verdicts, n, gain)


def run_until(adapter, stop: Callable[[], Optional[str]], poll_s: float = 1.0) -> Dict[str, Any]:
    """Run ``adapter`` in a thread until it stops by itself (its caps) or ``stop()`` names a reason."""
    box: Dict[str, Any] = {}
    th = threading.Thread(target=lambda: box.update(out=adapter.run()), name="adapter", daemon=True)
    th.start()
    while th.is_alive():
        why = stop()
        if why:
            adapter.request_stop(why)
            break
        time.sleep(poll_s)
    th.join()
    return box.get("out") or {}


def sft_snapshot(env, regime, s: Dict[str, Any], run_dir: Path, say: Callable[[str], None]) -> Path:
    """Run the SFT phase of ``regime`` on the server of ``env`` (url, client, push, load); returns the snapshot."""
    snap = run_dir / "snapshot"
    if (snap / "plateau.json").is_file():
        say(f"{regime.name}: snapshot kept from an earlier run ({snap.name}/plateau.json)")
        return snap
    work = run_dir / "sft_phase"
    shutil.rmtree(work, ignore_errors=True)
    drafter = env.load_drafter()
    ad = make_adapter(env.client, drafter, work, "sft", {"seqs_per_step": s["sizes"]["seqs"],
                                                         "anchors_per_seq": s["sizes"]["anchors"]}, s,
                      push=env.push, serving_version=env.serving_version, max_steps=s["plateau_max_steps"],
                      max_minutes=s["plateau_max_minutes"])
    say(f"{regime.name}: SFT from traffic at T={regime.temperature:g} until the held-out gain plateaus "
        f"(last {s['plateau_verdicts']} gains < {s['plateau_gain']}, or {s['plateau_max_steps']} steps)")
    t0 = time.monotonic()
    with env.load(regime, offset=0):
        out = run_until(ad, lambda: "plateau" if plateaued(ad, s["plateau_verdicts"], s["plateau_gain"]) else None)
    stopped = "plateau" if plateaued(ad, s["plateau_verdicts"], s["plateau_gain"]) else out.get("stopped_by")
    ad.drafter.load_state_dict(ad.deployed.state_dict())  # the snapshot: what the guard last deployed
    env.push(ad.drafter, SNAPSHOT_VERSION)
    ad.state.deployed.append({"version": SNAPSHOT_VERSION, "step": ad.state.step, "t_s": ad.state.wall_s,
                              "why": "opd_regimes snapshot"})
    with env.load(regime, offset=1, requests=s["record_requests"]):
        pass
    for _ in range(4):
        ad.ingest()
    ad.checkpoint()
    shutil.rmtree(snap, ignore_errors=True)
    shutil.copytree(work, snap)
    rec = {"stopped_by": stopped, "step": ad.state.step, "wall_s": round(time.monotonic() - t0, 1),
           "train_items": len(ad.train_buf), "holdout_items": len(ad.hold_buf),
           "gains": [v.get("diff") for v in ad.state.verdicts if v.get("kind") == "candidate"],
           "pushes": ad.state.pushes}
    (snap / "plateau.json").write_text(json.dumps(rec) + "\n")
    say(f"{regime.name}: SFT phase stopped by {stopped} at step {rec['step']} ({rec['wall_s']:.0f} s, "
        f"{rec['train_items']} train / {rec['holdout_items']} held-out requests); snapshot taken")
    return snap
