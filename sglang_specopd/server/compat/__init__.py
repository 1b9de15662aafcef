"""The plugin's SGLang compatibility surface: every SGLang symbol it reads, subclasses, hooks or patches.

The plugin runs inside SGLang and leans on internals of one release (pinned ``sglang==0.5.23``). This package
is the ONE place that names them: :data:`SYMBOLS` (in :mod:`.table`, re-exported here) is a table of
:class:`Symbol` (in :mod:`.symbol`; dotted path, how the plugin uses it, the parameter names it relies on, the
attributes it reads), and every other plugin module obtains SGLang objects through it instead of importing ``sglang``
(``.importlinter`` enforces that; only this package may import it):

* :func:`get` ``("DFlashWorkerV2")`` -> the object (imported on first use: importing this module imports nothing
  of SGLang, so the app can import the plugin's entry point cheaply);
* :func:`hook` ``("RadixAttention.forward", fn)`` registers ``fn`` with SGLang's ``HookRegistry`` at the table's
  target string with the table's hook type;
* :func:`patch` ``(name, value)`` sets a module or class attribute the plugin replaces (returns the old value).

:func:`sglang_specopd.server.compat.check.check_compat` (called first by ``register()``) verifies the table
against the installed SGLang, so a moved or renamed symbol fails the plugin's registration with one line
instead of silently serving SGLang's unpatched behaviour (SGLang's ``apply_hooks`` only logs a missing target).
"""

from __future__ import annotations

import importlib
from typing import Any, Tuple

from sglang_specopd.server.compat.symbol import Kind, Symbol  # noqa: F401
from sglang_specopd.server.compat.table import BY_NAME, PINNED_SGLANG, SYMBOLS, WEIGHT_UPDATE_HOOKS  # noqa: F401


def symbol(name: str) -> Symbol:
    """The table entry ``name``. Raises KeyError (listing nothing else) if the plugin names an unknown symbol."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in sglang_specopd.server.compat.SYMBOLS") from None


def target(name: str) -> str:
    """The dotted path of ``name`` (``"sglang.srt.layers.radix_attention.RadixAttention.forward"``)."""
    return symbol(name).target


def _resolve(sym: Symbol) -> Tuple[Any, Any]:
    """``(owner, value)``: the module or class holding ``sym``'s last attribute, and that attribute.
    Raises ImportError (module) or AttributeError (attribute path)."""
    owner = importlib.import_module(sym.module)
    parts = sym.qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, getattr(owner, parts[-1])


def get(name: str) -> Any:
    """The SGLang object ``name`` (imports its module on first use). Raises KeyError for a name not in the
    table, ImportError / AttributeError when the installed SGLang lacks it (``check_compat`` reports those first)."""
    return _resolve(symbol(name))[1]


def owner(name: str) -> Any:
    """The module or class that holds ``name`` (where :func:`patch` assigns)."""
    return _resolve(symbol(name))[0]


def patch(name: str, value: Any) -> Any:
    """Assign ``value`` to the monkeypatched attribute ``name``; return the previous value.
    Raises ValueError if the table does not list ``name`` as a monkeypatch."""
    sym = symbol(name)
    if Kind.MONKEYPATCH not in sym.kinds:
        raise ValueError(f"{name} is not a monkeypatch target in compat.SYMBOLS (kinds: {_kinds(sym)})")
    holder, old = _resolve(sym)
    setattr(holder, sym.qualname.rsplit(".", 1)[-1], value)
    return old


def hook_kind(sym: Symbol) -> Kind:
    """The one hook kind of ``sym``. Raises ValueError if it has none (or several)."""
    hooks = [k for k in sym.kinds if k.hook_type]
    if len(hooks) != 1:
        raise ValueError(f"{sym.name} has {len(hooks)} hook kinds in compat.SYMBOLS (kinds: {_kinds(sym)})")
    return hooks[0]


def hook(name: str, fn) -> None:
    """``HookRegistry.register(target(name), fn, HookType.<the table's hook type>)``."""
    sym = symbol(name)
    kind = hook_kind(sym)
    get("HookRegistry").register(sym.target, fn, getattr(get("HookType"), kind.hook_type))


def entries(*, cpu: bool) -> Tuple[Symbol, ...]:
    """The table entries in use: all of them with ``cpu``, else those that are not CPU-only."""
    return tuple(s for s in SYMBOLS if cpu or not s.cpu_only)


def _kinds(sym: Symbol) -> str:
    return ", ".join(k.value for k in sym.kinds)
