"""Lazy ``triton.jit`` of the fused kernels, one build per value of TRITON_INTERPRET.

Kernels are plain functions decorated at first use, so setting ``TRITON_INTERPRET=1`` any time before the first
call runs them on CPU with the interpreter, even if triton was imported earlier (the tests do this).
"""

from __future__ import annotations

from typing import Callable, Dict, Sequence, Tuple

__all__ = ["interpret", "lazy_jit"]


def interpret() -> bool:
    """True when TRITON_INTERPRET=1 is set now (triton must be importable)."""
    import triton

    return bool(triton.knobs.runtime.interpret)


def lazy_jit(cache: Dict[bool, Tuple], fns: Sequence[Callable], available: bool, missing: str) -> Tuple:
    """``triton.jit`` of every function in ``fns`` for the current TRITON_INTERPRET value, cached in ``cache``.

    available: whether the caller's triton imported; missing: the RuntimeError message raised when it did not.
    """
    if not available:
        raise RuntimeError(missing)
    import triton

    key = interpret()
    if key not in cache:
        cache[key] = tuple(triton.jit(f) for f in fns)
    return cache[key]
