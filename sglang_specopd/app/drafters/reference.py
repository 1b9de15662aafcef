"""Trained reference drafters shipped with sglang-specopd, so a fresh machine serves a useful drafter at once.

Where they live: ``sglang_specopd/assets/drafters/<target directory name>-b<block_size>/`` (``config.json``,
``model.safetensors`` in bf16, ``training_record.json``: the command, data, steps, commit and result file that
produced it). How one is reproduced: ``benchmarks/reference_drafter.py`` (``collect``, ``sft``, ``report``,
``ship``). Who uses it: a config's ``drafter: default`` serves the reference drafter of its target and block size
when one ships and fits the target (else the random-init default), ``specopd demo`` serves it unless the user
trained a newer drafter with ``specopd main``, and ``specopd main`` starts its SpecOPD from it instead of a short
SFT. ``SPECOPD_REFERENCE_DRAFTERS`` points at another directory of the same layout (``off`` disables them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets" / "drafters"
ENV_VAR = "SPECOPD_REFERENCE_DRAFTERS"
RECORD = "training_record.json"


def reference_drafters_dir() -> Optional[Path]:
    """The directory searched for reference drafters: ``$SPECOPD_REFERENCE_DRAFTERS`` if set (``off`` / ``0`` /
    empty: none), else the package's ``assets/drafters``."""
    value = os.environ.get(ENV_VAR)
    if value is None:
        return ASSETS_DIR
    return None if value.strip().lower() in ("", "0", "off", "none") else Path(value).expanduser()


def reference_drafter_name(target_dir: Path, block_size: int) -> str:
    """The directory name of the reference drafter for ``target_dir`` at ``block_size``: ``<target>-b<B>``."""
    return f"{Path(target_dir).name}-b{block_size}"


def reference_drafter(target_dir: Path, block_size: int) -> Optional[Path]:
    """The shipped reference drafter for ``target_dir`` with ``block_size``, or None when none ships, its weights
    are missing, or it does not fit the target (:func:`sglang_specopd.app.drafters.check.check_drafter`: a different
    model under the same directory name). Never raises for a bad checkpoint."""
    root = reference_drafters_dir()
    if root is None:
        return None
    path = root / reference_drafter_name(target_dir, block_size)
    if not (path / "model.safetensors").is_file():
        return None
    from sglang_specopd.app.drafters.check import check_drafter

    return None if check_drafter(path, target_dir) else path
