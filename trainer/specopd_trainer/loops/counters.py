"""Cumulative supervision counters of the server-driven loops (SpecOPD, sequential OPD), kept across resumes.

``counters.json`` in the run directory maps a completed step to {supervised_tokens, wall_s}; a resumed run reads
the row of the checkpoint it starts from, so ``supervised_tokens`` and ``supervised_wall_s`` in metrics.jsonl
continue over resumes (rows past that checkpoint, written before a crash, are dropped by the engine:
:func:`specopd_trainer.loops.engine.resume_metrics`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Dict

COUNTERS_FILE = "counters.json"


class Counters:
    """Cumulative supervised tokens and training wall time, persisted per step so that a resume continues them.

    ``counters.json`` maps a step (completed steps) to {supervised_tokens, wall_s}; it is written atomically by
    rank 0 at the end of each step function, i.e. before the engine checkpoints that step, and keeps the steps
    of the last ``3 * ckpt_every + batch_steps`` (the latest checkpoint is among them: the engine checkpoints at
    least every ``ckpt_every + batch_steps - 1`` steps).
    """

    def __init__(self, run_dir: Path, ckpt_every: int, rank: int, batch_steps: int = 1):
        from specopd_trainer.checkpoint import latest_checkpoint

        self.path = run_dir / COUNTERS_FILE
        self.window = 3 * ckpt_every + batch_steps
        self.rank = rank
        self.table: Dict[str, dict] = {}
        if self.path.is_file():
            self.table = json.loads(self.path.read_text())
        ckpt = latest_checkpoint(run_dir)
        self.start_step = int(ckpt.stem.split("-")[-1]) if ckpt is not None else 0
        row = self.table.get(str(self.start_step), {}) if self.start_step else {}
        self.tokens = int(row.get("supervised_tokens", 0))
        self.wall_before = float(row.get("wall_s", 0.0))
        self.t0 = time.monotonic()

    def wall(self) -> float:
        """Training wall seconds so far, resumes included."""
        return self.wall_before + time.monotonic() - self.t0

    def add(self, done_steps: int, tokens: int) -> Dict[str, float]:
        """Count ``tokens`` supervised by the step that completed ``done_steps``; returns the cumulative metrics
        (``supervised_tokens``, ``supervised_wall_s``, ``supervised_tokens_per_s``)."""
        self.tokens += int(tokens)
        wall = self.wall()
        if self.rank == 0:
            self.table[str(done_steps)] = {"supervised_tokens": self.tokens, "wall_s": round(wall, 3)}
            keys = sorted(int(k) for k in self.table)
            self.table = {str(k): self.table[str(k)] for k in keys if k >= keys[-1] - self.window}
            _atomic_write_text(self.path, json.dumps(self.table))
        return {"supervised_tokens": self.tokens, "supervised_wall_s": wall,
                "supervised_tokens_per_s": self.tokens / max(wall, 1e-9)}


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def passthrough(metrics: dict, handled) -> dict:
    """The int/float (not bool) entries of ``metrics`` whose key is not in ``handled``."""
    return {k: v for k, v in metrics.items()
            if k not in handled and isinstance(v, (int, float)) and not isinstance(v, bool)}
