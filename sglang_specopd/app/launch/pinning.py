"""Pin a command to CPU cores, and write core lists as SGLang and ``taskset`` do (``0-3,8``).

Used by a single launch (:class:`sglang_specopd.app.launch.process.SGLangServer` with ``cpu_cores``) and by the
fleet's planner (:mod:`sglang_specopd.app.fleet.plan`, one core slice per worker). Pure functions.
"""

from __future__ import annotations

import sys
from typing import List, Optional, Sequence


def cpu_list(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"`` (the list format of ``taskset -c``, ``numa_parse_cpustring`` and SGLang's
    ``SGLANG_CPU_OMP_THREADS_BIND``)."""
    cs = sorted(set(int(c) for c in cores))
    if not cs:
        raise ValueError("an empty core list")
    parts, start, prev = [], cs[0], cs[0]
    for c in cs[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(parts)


def pinned_argv(argv: Sequence[str], cores: Sequence[int], python: Optional[str] = None) -> List[str]:
    """``argv`` run with its CPU affinity set to ``cores`` (inherited by every process it starts): a Python
    one-liner that calls ``os.sched_setaffinity`` and then ``os.execv``s ``argv`` (no ``preexec_fn``, which is
    unsafe when threads start servers, and no dependency on ``taskset``)."""
    if not cores:
        raise ValueError("an empty core list")
    code = (f"import os, sys; os.sched_setaffinity(0, {sorted(set(int(c) for c in cores))}); "
            "os.execv(sys.argv[1], sys.argv[1:])")
    return [python or sys.executable, "-c", code, *argv]
