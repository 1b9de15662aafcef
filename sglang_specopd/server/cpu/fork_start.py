"""CPU adaptation 17: SGLang's scheduler and detokenizer processes start by ``fork`` on the CPU engine.

SGLang sets the ``spawn`` start method (``_set_envs_and_config``), which is what CUDA needs: a forked child of a
process that touched CUDA cannot use it. So each child re-imports SGLang, re-runs every plugin and re-applies the
hooks before it does anything: a SmolLM2 server takes 79.3 s from launch to healthy with spawn, 47.2 s with fork, on a
quiet 2-core AMD EPYC with AVX2 (``benchmarks/results/server_start_smollm2_epyc-avx2-fp32.json``). The CPU engine has no CUDA context to lose, and at that point the launcher has
imported SGLang and applied the plugin's hooks but started no thread, socket or compute, so the children fork from
it with everything already in place (copy-on-write: they also share those pages).

Off on GPU (registered only on the CPU engine, and the hook re-checks the device); ``SPECOPD_CPU_START_METHOD=spawn``
keeps SGLang's spawn on CPU too.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading

from sglang_specopd.server import compat

logger = logging.getLogger("sglang_specopd.server.cpu")

#: the environment variable that chooses the CPU engine's start method (``fork``, the default, or ``spawn``)
START_METHOD_ENV = "SPECOPD_CPU_START_METHOD"


def start_method() -> str:
    """The start method for the CPU engine's children: ``fork`` unless :data:`START_METHOD_ENV` says ``spawn``.
    Raises ValueError naming the variable for any other value."""
    value = os.environ.get(START_METHOD_ENV, "fork").strip().lower() or "fork"
    if value not in ("fork", "spawn"):
        raise ValueError(f"{START_METHOD_ENV}={value!r}: use fork or spawn")
    return value


def fork_children_on_cpu(result, server_args, *args, **kwargs):
    """AFTER hook on ``engine._set_envs_and_config``: on the CPU device, replace the ``spawn`` it set with ``fork``.

    Keeps spawn (and logs why) where a fork would not be safe: another thread is running in the launcher (a fork
    copies only the calling thread, so a lock another thread held stays held in the child)."""
    device = str(compat.get("resolving_view")(server_args).device).split(":")[0]
    if device != "cpu" or start_method() != "fork":
        return result
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()]
    if others:
        logger.info("sglang-specopd: children start by spawn (threads running in the launcher: %s)", others)
        return result
    mp.set_start_method("fork", force=True)
    logger.info("sglang-specopd: the CPU engine's scheduler and detokenizer start by fork (%s=spawn to keep spawn)",
                START_METHOD_ENV)
    return result


def register_fork_start() -> None:
    """Register :func:`fork_children_on_cpu` (CPU engine only)."""
    start_method()  # a bad value fails the launch here, with the variable's name
    compat.hook("engine._set_envs_and_config", fork_children_on_cpu)
