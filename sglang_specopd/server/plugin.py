"""SGLang general-plugin entry point (``[project.entry-points."sglang.srt.plugins"] specopd``).

SGLang calls :func:`register` early in every server process (launcher, tokenizer manager, scheduler,
detokenizer). After checking that the installed SGLang still has every symbol the plugin uses
(:mod:`sglang_specopd.server.compat`), it registers the SPECOPD speculative algorithm (DFlash / DFlash V2 drafters) and
SPECOPD_DSPARK (DSpark drafters, :mod:`sglang_specopd.server.algorithm.dspark`), the trace-carrying output streamer,
and, only on SGLang's CPU engine, the CPU adaptations in :mod:`sglang_specopd.server.cpu.patches`.
"""

from __future__ import annotations

import logging
import os
from typing import Dict, Optional

logger = logging.getLogger("sglang_specopd")


def register() -> None:
    """Register everything sglang-specopd adds to SGLang (idempotent).

    First checks that the installed SGLang has every symbol the plugin uses (:mod:`sglang_specopd.server.compat`;
    the CPU engine's ones only when it is on) and registers nothing when one is missing or changed.

    Raises:
        sglang_specopd.server.compat.check.SGLangCompatError: one line naming the broken symbol(s), the pinned and
            the installed SGLang version. It is a ``SystemExit``, so SGLang's ``load_plugins`` (which logs and
            skips a plugin raising ``Exception``) does not swallow it: the server process exits with that line.
    """
    from sglang_specopd.server import compat
    from sglang_specopd.server.compat.check import check_compat
    from sglang_specopd.server.cpu import cpu_engine_enabled

    cpu = cpu_engine_enabled()
    check_compat(cpu=cpu)
    from sglang_specopd.server.algorithm.specopd import register_algorithm
    from sglang_specopd.server.algorithm.dspark import register_dspark_algorithm

    if cpu:
        from sglang_specopd.server.cpu.patches import register_cpu_adaptations

        register_cpu_adaptations()
    from sglang_specopd.server.fixes import register_fixes

    register_fixes()
    register_algorithm()
    register_dspark_algorithm()
    import sglang_specopd.server.drafter.swap  # noqa: F401  (registers the swap_drafter / drafter_info ops)
    import sglang_specopd.server.drafter.rollout  # noqa: F401  (registers the stage / commit / abort / expire ops)
    from sglang_specopd.server.traces import verify_trace_param
    from sglang_specopd.server.traffic.spool import register_traffic_op, verify_spool_param

    register_traffic_op()
    compat.hook("SamplingParams.verify", verify_trace_param)  # custom_params.specopd_trace must be a bool (400)
    compat.hook("SamplingParams.verify", verify_spool_param)  # custom_params.specopd_spool too
    from sglang_specopd.server.control import register_control
    from sglang_specopd.server.routes import register_routes
    from sglang_specopd.server.scoring.forward import register_scoring

    from sglang_specopd.server.scoring.queue import register_score_queue

    register_control()
    register_scoring()
    register_score_queue()
    register_routes()
    from sglang_specopd.server.goodput.control import register_policy_routes

    register_policy_routes()  # GET / POST /specopd/policy (the speculative policy) and the op behind them
    from sglang_specopd.server.drafter.swap import current_version
    from sglang_specopd.server.metrics.hooks import register_metrics

    register_metrics(current_version)  # Prometheus series on SGLang's /metrics (--enable-metrics; docs/metrics.md)
    from sglang_specopd.server.streamer import get_output_streamer_class

    compat.hook("Scheduler.get_output_streamer_class", get_output_streamer_class)
    logger.info("sglang-specopd plugin registered")


def launch_environment(device: str, base: Optional[Dict[str, str]] = None, prefix_cache_mb: int = 0,
                       score=None, traffic_spool_mb: float = 0, traffic_features_mb: float = 0) -> Dict[str, str]:
    """Environment for the SGLang process: the score_trees prefix cache's size (``SPECOPD_PREFIX_CACHE_MB``), the
    score_trees budget / queue / cost cap (``score``: a :class:`sglang_specopd.server.scoring.cost.ScoreSettings`,
    ``SPECOPD_SCORE_*``; None: the defaults), the live-traffic spool's budget (``traffic_spool_mb`` MiB, 0 = off;
    ``SPECOPD_TRAFFIC_SPOOL_BYTES``, :mod:`sglang_specopd.server.traffic.spool`), the features captured while serving
    (``traffic_features_mb``, ``SPECOPD_TRAFFIC_FEATURES_BYTES``, :mod:`sglang_specopd.server.traffic.features`) and,
    on CPU, the CPU engine and the
    ``sgl_kernel`` stand-in."""
    from sglang_specopd.server.prefix_cache import ENV_VAR
    from sglang_specopd.server.scoring.cost import ScoreSettings
    from sglang_specopd.server.traffic.spool import spool_env
    from sglang_specopd.server.traffic.features import features_env

    env = dict(os.environ if base is None else base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env[ENV_VAR] = str(int(prefix_cache_mb))
    env.update((score or ScoreSettings()).env())
    env.update(spool_env(traffic_spool_mb))
    env.update(features_env(traffic_features_mb))
    if device == "cpu":
        from sglang_specopd.server.cpu import STANDIN_DIR

        env["SGLANG_USE_CPU_ENGINE"] = "1"
        # Measured on the 2-core CI machine: with one OpenMP thread per core (busy-waiting), a server that shares
        # the cores with a trainer or another server ran ~13x slower than with one thread (3 x 48 SmolLM2 fp32
        # tokens: 155-161 s vs 12 s). Override with SPECOPD_CPU_SERVER_THREADS (or an explicit OMP_NUM_THREADS).
        threads = env.get("SPECOPD_CPU_SERVER_THREADS") or env.get("OMP_NUM_THREADS") or "1"
        env["OMP_NUM_THREADS"] = threads
        # Hybrid GDN targets: SGLang stores the conv windows of its mamba pool in bfloat16 by default
        # (SGLANG_MAMBA_CONV_DTYPE), whatever --dtype says, so a float32 server's decode convolves bf16-rounded past
        # inputs (log-prob errors ~0.05 on the tiny target). On CPU keep them in float32 (a few KB per request).
        env.setdefault("SGLANG_MAMBA_CONV_DTYPE", "float32")
        parts = [str(STANDIN_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(parts)
    return env
