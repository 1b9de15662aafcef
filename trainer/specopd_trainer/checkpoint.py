"""Atomic training checkpoints with exact resume.

A checkpoint is one ``torch.save`` file ``<run>/checkpoints/step-<N>.pt`` holding the drafter's state, the
optimiser and LR-scheduler states, the step, the training config and the RNG states; it is written to a temp
file in the same directory, fsynced and renamed, then ``latest`` (a text file with the file name) is replaced
the same way. A crash at any point leaves the previous checkpoint loadable. The last ``keep`` checkpoints are
kept. Exported drafters (SGLang format) are separate (``DFlashDrafter.save_pretrained``).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

import torch


class CheckpointError(RuntimeError):
    """A checkpoint could not be read (missing, truncated or from an incompatible run)."""


def atomic_write_bytes(path: Path, write) -> None:
    """Write ``path`` through ``write(binary file)`` into a temp file in the same directory, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def rng_state() -> Dict[str, Any]:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def set_rng_state(state: Dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: str | Path, step: int, state: Dict[str, Any], keep: int = 2) -> Path:
    """Atomically write ``state`` (plus ``step`` and RNG states) as ``step-<step>.pt`` and point ``latest`` at it."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    path = ckpt_dir / f"step-{step:07d}.pt"
    payload = {**state, "step": step, "rng": rng_state()}
    atomic_write_bytes(path, lambda fh: torch.save(payload, fh))
    atomic_write_bytes(ckpt_dir / "latest", lambda fh: fh.write(path.name.encode()))
    old = sorted(ckpt_dir.glob("step-*.pt"))[:-keep] if keep > 0 else []
    for p in old:
        p.unlink(missing_ok=True)
    return path


def latest_checkpoint(run_dir: str | Path) -> Optional[Path]:
    """The checkpoint ``latest`` points to, or None for a fresh run."""
    ckpt_dir = Path(run_dir) / "checkpoints"
    pointer = ckpt_dir / "latest"
    if not pointer.is_file():
        return None
    path = ckpt_dir / pointer.read_text().strip()
    if not path.is_file():
        raise CheckpointError(f"{pointer} points to {path.name}, which does not exist")
    return path


def load_checkpoint(path: str | Path, restore_rng: bool = True) -> Dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (CPU tensors); optionally restore RNG states."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # truncated/corrupt file
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from None
    if restore_rng and "rng" in state:
        set_rng_state(state["rng"])
    return state


def truncate_metrics_log(path: str | Path, step: int) -> bool:
    """Keep exactly the rows of a ``metrics.jsonl`` a run resuming from checkpoint ``step`` must keep.

    Rows with ``"step" > step`` were written after that checkpoint, before a crash: the resumed run recomputes
    and logs those steps again, so they are dropped (one row per step, never two). A line that is not a JSON
    object (the tail of a write cut by ``kill -9``) is dropped too. The file is replaced atomically (a crash
    here leaves the old or the new file, whole). Returns whether anything was dropped; a missing file is a no-op.
    """
    path = Path(path)
    if not path.is_file():
        return False
    lines = path.read_text().splitlines()
    keep = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step", 0), (int, float)) and row.get("step", 0) <= step:
            keep.append(line)
    if len(keep) == len(lines):
        return False
    atomic_write_bytes(path, lambda fh: fh.write("".join(line + "\n" for line in keep).encode()))
    return True
