"""The types of the compatibility table: :class:`Kind` (how the plugin uses an SGLang symbol) and :class:`Symbol`
(one table entry). Pure data, no SGLang import; the table itself is :mod:`sglang_specopd.server.compat.table`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Tuple


class Kind(str, Enum):
    """How the plugin uses a symbol."""

    READ = "read"  # read or called
    SUBCLASS = "subclass"  # the plugin subclasses it
    OVERRIDE = "override"  # a method a plugin subclass (or stand-in object) overrides; SGLang calls it
    HOOK_BEFORE = "hook BEFORE"  # HookRegistry hooks (sglang.srt.plugins.hook_registry.HookType)
    HOOK_AFTER = "hook AFTER"
    HOOK_AROUND = "hook AROUND"
    HOOK_REPLACE = "hook REPLACE"
    MONKEYPATCH = "monkeypatch"  # the plugin assigns (or mutates) this module / class attribute
    ROUTE = "route"  # the FastAPI app the plugin adds routes to

    @property
    def hook_type(self) -> str | None:
        """``BEFORE`` / ``AFTER`` / ``AROUND`` / ``REPLACE`` for hook kinds, else None."""
        return self.value.split(" ", 1)[1] if self.value.startswith("hook ") else None


@dataclass(frozen=True)
class Symbol:
    """One SGLang symbol the plugin depends on.

    Attributes:
        name: the key the plugin uses (``compat.get(name)``), unique in :data:`SYMBOLS`.
        module: the SGLang module defining it (``sglang.srt...``).
        qualname: the attribute path inside ``module`` (``Class.method`` or ``function``).
        kinds: every way the plugin uses it (:class:`Kind`).
        params: parameter names the plugin relies on (passes by name, or receives in a hook / override).
        attrs: attributes the plugin reads on it or its instances (enum members, ``self.x`` set by SGLang).
        used_by: the plugin modules that use it (relative to ``sglang_specopd.server``).
        cpu_only: used only by the CPU engine's adaptations (checked only when that engine is on).
        may_be_none: the attribute may be None in this install (an op resolved only on some devices).
    """

    name: str
    module: str
    qualname: str
    kinds: Tuple[Kind, ...]
    params: Tuple[str, ...] = ()
    attrs: Tuple[str, ...] = ()
    used_by: Tuple[str, ...] = ()
    cpu_only: bool = False
    may_be_none: bool = False

    @property
    def target(self) -> str:
        """The fully-qualified dotted path (what ``HookRegistry.register`` takes)."""
        return f"{self.module}.{self.qualname}"
