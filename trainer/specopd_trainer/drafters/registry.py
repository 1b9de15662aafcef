"""The trainer's drafter registry: drafter architecture name -> trainable ``nn.Module`` class.

Names, HF architectures, config parsing and tensor layouts come from the one registry of drafter architectures,
:mod:`sglang_specopd.wire.drafters.archs` (also read by the server and the CLI); this module only adds the class.
Drafter modules register themselves with ``@register_drafter(name)`` where ``name`` is a registered architecture;
the built-in modules listed in :data:`BUILTIN_MODULES` are imported on first lookup, so importing this module stays
light. Built in: DFlash ("dflash", :mod:`.dflash`), DFlash V2 ("dflash2", ``DFlash2DraftModel``, :mod:`.dflash2`)
and DSpark ("dspark", ``DSparkDraftModel``, :mod:`.dspark`). Another drafter is an entry in ``sglang_specopd.wire.drafters.archs`` plus
a module whose class is decorated with ``@register_drafter("<name>")`` (added to :data:`BUILTIN_MODULES` or imported
before lookup). Every registered class must provide ``from_pretrained(drafter_dir, target_dir=None)`` and
``save_pretrained(out_dir)`` writing its entry's format.
"""

from __future__ import annotations

import importlib
import os
from typing import Callable, TypeVar

from sglang_specopd.wire.drafters.archs import UnknownDrafterArchError, arch_for_config, drafter_arch_names
from sglang_specopd.wire.drafters.archs import get_drafter_arch
from sglang_specopd.wire.drafters.format import read_drafter_config

BUILTIN_MODULES = ("specopd_trainer.drafters.dflash", "specopd_trainer.drafters.dflash2",
                   "specopd_trainer.drafters.dspark")
DRAFTERS: dict[str, type] = {}
_T = TypeVar("_T", bound=type)
_loaded = False


class UnknownDrafterError(UnknownDrafterArchError):
    """A drafter name or checkpoint architecture that no registered drafter class handles (a KeyError)."""


def register_drafter(name: str) -> Callable[[_T], _T]:
    """Class decorator: register ``cls`` as the trainable drafter of the registered architecture ``name``.

    Sets ``cls.drafter_name`` (``name``) and ``cls.drafter_arch`` (its
    :class:`~sglang_specopd.wire.drafters.archs.DrafterArch`).

    Raises:
        UnknownDrafterError: ``name`` is not a registered drafter architecture.
        ValueError: another class is already registered as ``name``.
    """
    try:
        arch = get_drafter_arch(name)
    except UnknownDrafterArchError as exc:
        raise UnknownDrafterError(str(exc)) from None

    def deco(cls: _T) -> _T:
        if DRAFTERS.get(name, cls) is not cls:
            raise ValueError(f"drafter {name!r} is already registered to {DRAFTERS[name].__name__}")
        DRAFTERS[name] = cls
        cls.drafter_name = name
        cls.drafter_arch = arch
        return cls

    return deco


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        _loaded = True


def drafter_names() -> list[str]:
    """Sorted names of all drafters with a trainable class."""
    _load_builtins()
    return sorted(DRAFTERS)


def get_drafter_class(name: str) -> type:
    """The class registered as ``name``.

    Raises UnknownDrafterError (a KeyError) listing the registered drafters; it says so when ``name`` is a
    registered architecture that has no trainable class."""
    _load_builtins()
    if name in DRAFTERS:
        return DRAFTERS[name]
    trainable = ", ".join(sorted(DRAFTERS))
    if name in drafter_arch_names():
        raise UnknownDrafterError(f"drafter architecture {get_drafter_arch(name).label} has no trainable class; "
                                  f"registered drafters: {trainable}")
    raise UnknownDrafterError(f"unknown drafter {name!r}; registered drafters: {trainable}")


def drafter_class_for_checkpoint(drafter_dir: str | os.PathLike[str]) -> type:
    """The registered class for the architecture named by ``drafter_dir/config.json``.

    Raises: UnknownDrafterError (unknown architecture, or one without a trainable class), DrafterConfigError
    (a ValueError: missing or malformed config.json)."""
    try:
        arch = arch_for_config(read_drafter_config(drafter_dir))
    except UnknownDrafterArchError as exc:
        raise UnknownDrafterError(f"{drafter_dir}: {exc}") from None
    return get_drafter_class(arch.name)
