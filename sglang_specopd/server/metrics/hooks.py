"""Where the plugin's metrics meet SGLang: the scheduler's set-up hook and the score_trees route's wrapper.

* :func:`register_metrics` (from ``register()``): an AFTER hook on ``Scheduler.init_request_dispatcher`` turns
  recording on in each scheduler process when SGLang runs with ``--enable-metrics``, on attention-TP rank 0 only
  (SGLang's ``is_stats_logging_rank``: the other ranks of a TP group see the same batches), and sets the start-up
  drafter's ``drafter_info``;
* :func:`configure_http` (from the routes' ``launch_server`` hook): the same in the HTTP process;
* :func:`observe_score_trees`: counts a score_trees request, its refusal, its wait in the line and the line's depth.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from sglang_specopd.server import compat
from sglang_specopd.server.metrics import recorder


def configure_scheduler(scheduler: Any, initial_version: Callable[[], str]) -> bool:
    """Turn recording on in this scheduler process when SGLang's metrics are on and it is attention-TP rank 0."""
    args = getattr(scheduler, "server_args", None)
    on = bool(getattr(args, "enable_metrics", False))
    if on:
        on = int(getattr(compat.get("get_parallel")(), "attn_tp_rank", 0) or 0) == 0
    if recorder.configure(args, enabled=on):
        recorder.touch("scheduler")
        recorder.set_drafter_version(initial_version())
    return on


def register_metrics(initial_version: Callable[[], str]) -> None:
    """Hook :func:`configure_scheduler` after ``Scheduler.init_request_dispatcher`` (``initial_version``: the
    serving drafter's version then, ``hot_swap.current_version``)."""

    def after_init(result, self, *args, **kwargs):
        configure_scheduler(self, initial_version)
        return result

    compat.hook("Scheduler.init_request_dispatcher", after_init)


def configure_http(server_args: Any) -> bool:
    """Recording in the HTTP process (score_trees), when SGLang runs with ``--enable-metrics``."""
    return recorder.configure(server_args)


async def observe_score_trees(route: Callable[[Any], Awaitable[Any]], request: Any, line: Callable[[], Any]):
    """``await route(request)``, counted: the request, its 4xx refusal, its wait in the line (the reply header
    ``X-SpecOPD-Queue-Wait-S``) and the line's depth (``line().active``) when it arrived and when it was answered."""
    if not recorder.enabled():
        return await route(request)
    from sglang_specopd.wire.protocol import QUEUE_WAIT_HEADER

    recorder.score_arrived(line().active)
    reply = None
    try:
        reply = await route(request)
        return reply
    finally:
        status = getattr(reply, "status_code", None)
        waited = getattr(reply, "headers", {}).get(QUEUE_WAIT_HEADER.lower()) if reply is not None else None
        try:
            waited_s = float(waited) if waited is not None else None
        except ValueError:
            waited_s = None
        recorder.score_answered(status, waited_s, line().active)
