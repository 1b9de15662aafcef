"""The serving dtype on CPU: bf16 only where the CPU computes it natively, float32 elsewhere.

A CPU config may say ``dtype: auto``. On GPU, ``auto`` goes to SGLang as is (the checkpoint's dtype). On CPU it
is resolved here, before launch, from the CPU's instruction set: ``bfloat16`` when the CPU has native bf16
arithmetic (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``), else ``float32``. Without native bf16, oneDNN
emulates bf16 matmuls: on an AVX2-only AMD EPYC SmolLM2's prefill ran 9.0x (1 thread) / 12.6x (2 threads) slower
in bf16 than in float32 (``benchmarks/cpu_dtype.py``, ``benchmarks/results/cpu_dtype_cpu.json``). One of the CPU
adaptations listed in docs/cpu_adaptations.md; explicit dtypes in a config are never changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

__all__ = ["NATIVE_BF16_FLAGS", "cpu_flags", "cpu_has_native_bf16", "resolve_dtype"]

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset:
    """The instruction-set flags of the first CPU in ``cpuinfo`` (empty where the file is absent, e.g. macOS)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_has_native_bf16(flags: Optional[Iterable[str]] = None) -> bool:
    """Whether the CPU does bf16 arithmetic natively (``flags`` default: :func:`cpu_flags`)."""
    have = set(cpu_flags() if flags is None else flags)
    return any(f in have for f in NATIVE_BF16_FLAGS)


def resolve_dtype(device: str, dtype: str, flags: Optional[Iterable[str]] = None) -> str:
    """The ``--dtype`` SGLang gets: ``dtype`` unchanged unless ``device == "cpu"`` and ``dtype == "auto"``, then
    ``"bfloat16"`` if :func:`cpu_has_native_bf16` else ``"float32"``."""
    if device != "cpu" or dtype != "auto":
        return dtype
    return "bfloat16" if cpu_has_native_bf16(flags) else "float32"
