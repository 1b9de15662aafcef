"""SGLang general-plugin entry point (``[project.entry-points."sglang.srt.plugins"] specopd``).

SGLang calls :func:`register` early in every server process (launcher, tokenizer manager, scheduler,
detokenizer). It registers the SPECOPD speculative algorithm, the trace-carrying output streamer, and, only on
SGLang's CPU engine, the CPU adaptations in :mod:`sglang_specopd.cpu.patches`.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_specopd")


def register() -> None:
    """Register everything sglang-specopd adds to SGLang (idempotent)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_specopd.algorithm import register_algorithm
    from sglang_specopd.cpu import cpu_engine_enabled

    if cpu_engine_enabled():
        from sglang_specopd.cpu.patches import register_cpu_adaptations

        register_cpu_adaptations()
    from sglang_specopd.fixes import register_fixes

    register_fixes()
    register_algorithm()
    import sglang_specopd.hot_swap  # noqa: F401  (registers the swap_drafter / drafter_info ops)
    from sglang_specopd.control import register_control
    from sglang_specopd.routes import register_routes
    from sglang_specopd.scoring import register_scoring

    register_control()
    register_scoring()
    register_routes()
    from sglang_specopd.streamer import get_output_streamer_class

    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler.get_output_streamer_class",
        get_output_streamer_class,
        HookType.REPLACE,
    )
    logger.info("sglang-specopd plugin registered")
