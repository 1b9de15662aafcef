"""Fail fast when the installed SGLang no longer has what :mod:`sglang_specopd.server.compat` lists.

:func:`check_compat` runs first in the plugin's ``register()``: every table entry must import, have the kind of
object its use needs (a class to subclass, something callable to hook or call), accept the parameters the
plugin relies on, and carry the attributes the plugin reads (class attributes, enum members, dataclass fields,
or ``self.<name> = ...`` assignments in the source of the class or one of its SGLang bases). Any problem raises
ONE :class:`SGLangCompatError` whose message is a single line naming each broken symbol, what is wrong, the
pinned and the installed SGLang version. Without it SGLang's ``HookRegistry.apply_hooks`` would log a missing
hook target and serve on with the unpatched behaviour.

CPU-only entries (the CPU engine's adaptations) are checked only when the CPU engine is on: on a GPU server they
are never used, and a GPU deployment must not be refused over a CPU helper it does not run (they exist in every
install, so the tests check them always). Cost: ~30 ms on top of the imports SGLang's ``apply_hooks`` does anyway.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from importlib import metadata
from typing import List, Optional

from sglang_specopd.server.compat import PINNED_SGLANG, Kind, Symbol, _resolve, entries

_MAX_LISTED = 6


class SGLangCompatError(SystemExit):
    """The installed SGLang lacks (or changed) a symbol the plugin uses; the message is one line.

    A ``SystemExit`` on purpose: SGLang's ``load_plugins`` catches ``Exception`` from a plugin, logs it and starts
    the server without the plugin. Raised from :func:`sglang_specopd.server.plugin.register`, this error passes
    through that handler, so the SGLang process stops with exit code 1 and prints this one line, instead of
    serving without the plugin (or failing later on an unknown ``SPECOPD`` algorithm).
    """


def installed_sglang() -> str:
    """The installed SGLang's version (``"not installed"`` when it is absent); imports nothing of SGLang."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return "not installed"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


@functools.lru_cache(maxsize=None)
def _self_assigned(cls: type) -> frozenset:
    """Names assigned as ``self.<name>`` anywhere in ``cls``'s own source (empty when it has no source)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    return frozenset(node.attr for node in ast.walk(tree)
                     if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                     and isinstance(node.value, ast.Name) and node.value.id == "self")


def has_attribute(obj, name: str) -> bool:
    """True if ``obj`` has ``name``: as an attribute, or (for a class) a dataclass / msgspec field, an annotated
    attribute, or an instance attribute its own or an SGLang base class's source assigns to ``self.<name>``."""
    if hasattr(obj, name):
        return True
    if not isinstance(obj, type):
        return False
    for cls in inspect.getmro(obj):
        if name in getattr(cls, "__dataclass_fields__", {}) or name in getattr(cls, "__struct_fields__", ()):
            return True
        if name in vars(cls).get("__annotations__", {}):
            return True
        if cls.__module__.split(".")[0] == "sglang" and name in _self_assigned(cls):
            return True
    return False


def symbol_problems(sym: Symbol) -> List[str]:
    """What is wrong with ``sym`` in the installed SGLang (an empty list when nothing is)."""
    try:
        _, obj = _resolve(sym)
    except ImportError as exc:
        return [f"{sym.name}: module {sym.module} cannot be imported ({type(exc).__name__}: {_one_line(exc)})"]
    except AttributeError:
        return [f"{sym.name}: {sym.target} not found"]
    if obj is None:
        return [] if sym.may_be_none else [f"{sym.name}: {sym.target} is None"]
    problems = []
    if Kind.SUBCLASS in sym.kinds and not isinstance(obj, type):
        problems.append(f"{sym.name}: is a {type(obj).__name__}, not a class to subclass")
    needs_call = sym.params or any(k.hook_type or k == Kind.OVERRIDE for k in sym.kinds)
    if needs_call and not callable(obj):
        problems.append(f"{sym.name}: is a {type(obj).__name__}, not callable")
    elif sym.params:
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):  # a builtin without a signature: nothing to compare
            sig = None
        if sig is not None:
            missing = [p for p in sym.params if p not in sig.parameters]
            if missing:
                problems.append(f"{sym.name}: signature is {_one_line(_plain(sig))}, missing parameter(s) "
                                + ", ".join(repr(p) for p in missing))
    for attr in sym.attrs:
        if not has_attribute(obj, attr):
            problems.append(f"{sym.name}.{attr}: attribute not found on {sym.target}")
    return problems


def _plain(sig: inspect.Signature) -> str:
    """The signature with parameter names only (annotations and defaults dropped)."""
    return "(" + ", ".join(str(p.replace(annotation=p.empty, default=p.empty)) for p in sig.parameters.values()) + ")"


def compat_problems(*, cpu: bool) -> List[str]:
    """Every problem of the entries in use (CPU-only ones only with ``cpu``)."""
    return [p for sym in entries(cpu=cpu) for p in symbol_problems(sym)]


def format_problems(problems: List[str], installed: Optional[str] = None) -> str:
    """The one-line error message for ``problems``."""
    installed = installed or installed_sglang()
    shown = "; ".join(problems[:_MAX_LISTED])
    more = f"; and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
    return _one_line(f"sglang-specopd does not fit the installed SGLang (pinned sglang=={PINNED_SGLANG}, installed "
                     f"sglang=={installed}): {shown}{more}")


def check_compat(*, cpu: bool) -> None:
    """Raise :class:`SGLangCompatError` (one-line message) unless every entry in use fits the installed SGLang.

    Args:
        cpu: whether SGLang's CPU engine is on (then the CPU-only entries are checked too).
    """
    problems = compat_problems(cpu=cpu)
    if problems:
        raise SGLangCompatError(format_problems(problems))
