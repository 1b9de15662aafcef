"""Where sglang-specopd keeps prepared models and caches.

``$SPECOPD_HOME`` overrides the default ``$XDG_CACHE_HOME/specopd`` (``~/.cache/specopd``).
"""

from __future__ import annotations

import os
from pathlib import Path


def specopd_home() -> Path:
    """Root directory for prepared targets, drafters and data caches (created on demand)."""
    env = os.environ.get("SPECOPD_HOME")
    if env:
        root = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "specopd"
    root.mkdir(parents=True, exist_ok=True)
    return root


def models_dir() -> Path:
    """Directory holding prepared target checkpoints (``<home>/models``)."""
    d = specopd_home() / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d


def drafters_dir() -> Path:
    """Directory holding drafter checkpoints made by ``specopd drafter init`` / training (``<home>/drafters``)."""
    d = specopd_home() / "drafters"
    d.mkdir(parents=True, exist_ok=True)
    return d


def make_world_readable(root: Path) -> None:
    """chmod a directory tree to 0755 (dirs) / 0644 (files): ``mkdtemp`` and some writers create 0700/0600."""
    os.chmod(root, 0o755)
    for p in root.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
