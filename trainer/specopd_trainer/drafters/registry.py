"""The one registry of trainable drafter kinds: name -> ``nn.Module`` class.

Drafter modules register themselves with ``@register_drafter(name, architecture)``; the built-in modules
listed in :data:`BUILTIN_MODULES` are imported on first lookup, so importing this module stays light.
Extension points: a DFlash V2 drafter ("dflash2", SGLang architecture ``DFlash2DraftModel``: grouped conv +
candidate selector) or DSpark ("dspark") is a new module ``specopd_trainer.drafters.<name>`` whose class is
decorated with ``@register_drafter("<name>", "<SGLang architecture>")``, added to :data:`BUILTIN_MODULES`.
Every registered class must provide ``from_pretrained(drafter_dir, target_dir=None)`` and
``save_pretrained(out_dir)`` writing the SGLang checkpoint format.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Callable, TypeVar

BUILTIN_MODULES = ("specopd_trainer.drafters.dflash",)  # add "specopd_trainer.drafters.dflash2", ".dspark"
DRAFTERS: dict[str, type] = {}
ARCHITECTURES: dict[str, str] = {}  # SGLang config.json architecture -> registry name
_T = TypeVar("_T", bound=type)
_loaded = False


class UnknownDrafterError(KeyError):
    """A drafter name or checkpoint architecture that no registered drafter class handles."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def register_drafter(name: str, architecture: str) -> Callable[[_T], _T]:
    """Class decorator: register ``cls`` as drafter ``name`` loading checkpoints of ``architecture``.

    Raises ValueError if ``name`` or ``architecture`` is already taken by another class."""

    def deco(cls: _T) -> _T:
        if DRAFTERS.get(name, cls) is not cls or ARCHITECTURES.get(architecture, name) != name:
            raise ValueError(f"drafter name {name!r} or architecture {architecture!r} is already registered")
        DRAFTERS[name] = cls
        ARCHITECTURES[architecture] = name
        cls.drafter_name = name
        return cls

    return deco


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        _loaded = True


def drafter_names() -> list[str]:
    """Sorted names of all registered drafters."""
    _load_builtins()
    return sorted(DRAFTERS)


def get_drafter_class(name: str) -> type:
    """The class registered as ``name``. Raises UnknownDrafterError (a KeyError) listing the valid names."""
    _load_builtins()
    try:
        return DRAFTERS[name]
    except KeyError:
        raise UnknownDrafterError(f"unknown drafter {name!r}; registered drafters: {', '.join(sorted(DRAFTERS))}"
                                  ) from None


def drafter_class_for_checkpoint(drafter_dir: str | os.PathLike[str]) -> type:
    """The registered class for the ``architectures[0]`` of ``drafter_dir/config.json``.

    Raises: UnknownDrafterError (unknown architecture), OSError/ValueError (unreadable config)."""
    _load_builtins()
    cfg = json.loads((Path(drafter_dir) / "config.json").read_text())
    archs = cfg.get("architectures") or [None]
    name = ARCHITECTURES.get(archs[0])
    if name is None:
        raise UnknownDrafterError(f"{drafter_dir}: architecture {archs[0]!r} has no registered drafter; known: "
                                  f"{', '.join(sorted(ARCHITECTURES))}")
    return DRAFTERS[name]
