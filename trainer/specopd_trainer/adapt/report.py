"""What ``specopd adapt`` prints: one progress line, and the run's summary (also the JSON the loop returns)."""

from __future__ import annotations

import sys
import time
from typing import Any, Dict, Optional, TextIO

from specopd_trainer.adapt.state import AdaptState


def _k(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"


def status_line(state: AdaptState, *, train_items: int, holdout_items: int, loss: Optional[float]) -> str:
    """``traffic 12.3k tokens seen, 9.1k response tokens to train on (88 req, 22 held out) | step 340 loss 1.23 |
    candidate 1.48 vs deployed 1.31 (+0.17 [+0.09, +0.25], 24 req) | 3 pushes, 0 rollbacks | 1 bad item``."""
    parts = [f"traffic {_k(state.traffic_tokens_seen)} tokens seen, {_k(state.traffic_tokens_trained)} response "
             f"tokens to train on ({train_items} req, {holdout_items} held out)",
             f"step {state.step}" + (f" loss {loss:.3f}" if loss is not None else "")]
    parts.append(judged_part(state))
    parts.append(f"{state.pushes} push{'es' if state.pushes != 1 else ''}, {state.rollbacks} rollback"
                 f"{'s' if state.rollbacks != 1 else ''}")
    bad = state.reader.bad_total
    if bad or state.reader.missed:
        parts.append(f"{bad} bad item{'s' if bad != 1 else ''}, {state.reader.missed} missed")
    return " | ".join(parts)


def judged_part(state: AdaptState) -> str:
    """The last judgement, named for what it was: ``candidate 1.48 vs deployed 1.31 (...): rejected (why)``,
    ``pushed adapt-x-2 at step 300 (it measured ...): the candidate trains on from it``, ``rollback check ...``, or
    ``candidate not judged (why)`` / ``not judged yet``."""
    v = next((v for v in reversed(state.verdicts) if v.get("kind") in ("candidate", "deployed_vs_previous")), None)
    if v is None:
        return "candidate not judged yet"
    if v.get("ran") is False:
        return f"candidate not judged at step {v['step']} ({v['reason']})"
    lo, hi = v["ci95"]
    meas = f"{v['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}], {v['requests']} req"
    if v["kind"] == "deployed_vs_previous":
        what = f"rolled back to {v['pushed']}" if v.get("rolled_back") else "kept"
        return (f"rollback check at step {v['step']}: deployed {v['candidate_tau']:.3f} vs previous "
                f"{v['deployed_tau']:.3f} ({meas}): {what}")
    if v.get("pushed"):
        return (f"pushed {v['pushed']} at step {v['step']} (candidate {v['candidate_tau']:.3f} vs then deployed "
                f"{v['deployed_tau']:.3f}, {meas}): deployed now, the next candidate trains from it")
    if v.get("deploy"):  # passed, but the push failed
        return f"candidate at step {v['step']} passed but its push failed ({meas})"
    return (f"candidate rejected at step {v['step']}: {v['candidate_tau']:.3f} vs deployed {v['deployed_tau']:.3f} "
            f"({meas}): {v['reason']}")


class StatusPrinter:
    """Prints :func:`status_line` at most every ``every_s`` seconds: rewritten in place on a terminal, one line per
    period otherwise (logs)."""

    def __init__(self, every_s: float = 10.0, file: Optional[TextIO] = None, enabled: bool = True):
        self.every_s, self.file, self.enabled = every_s, file or sys.stderr, enabled
        self._last = 0.0
        self._tty = bool(getattr(self.file, "isatty", lambda: False)())

    def show(self, line: str, force: bool = False) -> bool:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < self.every_s):
            return False
        self._last = now
        if self._tty:
            self.file.write("\r\x1b[2K" + line[: 400])
        else:
            self.file.write(line + "\n")
        self.file.flush()
        return True

    def close(self) -> None:
        if self.enabled and self._tty:
            self.file.write("\n")
            self.file.flush()


def summary(state: AdaptState, *, train_items: int, holdout_items: int, stopped_by: str,
            buffers: Dict[str, Any]) -> Dict[str, Any]:
    """The run's result as JSON-able dict: the state plus buffer counts and why it stopped."""
    return {**state.as_dict(), "train_items": train_items, "holdout_items": holdout_items, "stopped_by": stopped_by,
            "buffers": buffers, "deployed_version": state.deployed_version}


def metrics_row(path, state: AdaptState, *, loss: Optional[float], train_items: int, holdout_items: int) -> None:
    """Append one JSON row (step, wall time, loss, counters, the last verdict) to ``path`` (``metrics.jsonl``)."""
    import json

    v = state.verdicts[-1] if state.verdicts else {}
    row = {"step": state.step, "wall_s": round(state.wall_s, 2), "loss": loss,
           "traffic_tokens_seen": state.traffic_tokens_seen, "pushes": state.pushes, "rollbacks": state.rollbacks,
           "train_items": train_items, "holdout_items": holdout_items, "last_verdict": v}
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")
