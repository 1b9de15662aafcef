"""The plugin's control channel between SGLang's HTTP process and the scheduler.

One request type (:class:`SpecOPDControlReq`, an ``op`` name + opaque bytes) and one reply type travel over
SGLang's own zmq IPC (msgspec structs registered with ``hook_custom_types`` in every process). The HTTP side uses
a ``FanOutCommunicator`` created by SGLang's tokenizer manager from ``_COMMUNICATOR_SPECS`` (queueing: one op
in flight at a time); the scheduler runs the op between batches in its event loop, so an op never races a
forward. Ops: ``drafter_info``, ``swap_drafter`` (:mod:`sglang_specopd.server.drafter.swap`), ``stage_drafter``,
``commit_drafter``, ``abort_drafter``, ``expire_drafter`` (:mod:`sglang_specopd.server.drafter.rollout`), ``prefix_cache`` and
``score_dims`` (:mod:`sglang_specopd.server.scoring.forward`).

Tree scoring has its own request / reply pair (:class:`SpecOPDScoreReq` / :class:`SpecOPDScoreOutput`)
and its own communicator (``specopd_score``): the scheduler answers it only when the request's last piece has run
(:mod:`sglang_specopd.server.scoring.queue`), possibly many iterations later. Replies are matched by type: a score
reply can only complete the score communicator's one in-flight call, so a long scoring request never holds up
the other ops, and the HTTP side shields that call from cancellation (a client that hangs up does not free the
slot before its reply arrives, so a late reply can never complete the next caller's call).
"""

from __future__ import annotations

import logging
import traceback
from typing import Callable, Dict

from sglang_specopd.server import compat
from sglang_specopd.server import metrics

BaseReq = compat.get("BaseReq")  # SGLang's msgspec IPC struct base

logger = logging.getLogger("sglang_specopd.server.control")

COMMUNICATOR_NAME = "specopd_control"


class SpecOPDControlReq(BaseReq, kw_only=True):
    op: str
    payload: bytes = b""


class SpecOPDControlOutput(BaseReq, kw_only=True):
    status: int = 200
    message: str = ""
    payload: bytes = b""


class SpecOPDScoreReq(BaseReq, kw_only=True):
    payload: bytes = b""  # a ScoreTreesRequest as JSON


class SpecOPDScoreOutput(BaseReq, kw_only=True):
    status: int = 200
    message: str = ""
    payload: bytes = b""


SCORE_COMMUNICATOR_NAME = "specopd_score"


_OPS: Dict[str, Callable] = {}


def op(name: str):
    """Register a scheduler-side op: ``fn(scheduler, payload: bytes) -> (status, message, payload)``."""

    def deco(fn):
        _OPS[name] = fn
        return fn

    return deco


def handle_control(scheduler, req: SpecOPDControlReq) -> SpecOPDControlOutput:
    """:func:`_handle_control`, its outcome counted (drafter ops: :mod:`sglang_specopd.server.metrics`)."""
    out = _handle_control(scheduler, req)
    metrics.record_control_op(req.op, out.status, out.payload, req.payload)
    return out


def _handle_control(scheduler, req: SpecOPDControlReq) -> SpecOPDControlOutput:
    """Run one op in the scheduler: ValueError -> 400, an exception with a ``control_status``
    (:class:`~sglang_specopd.server.drafter.txn.TxnConflict`: 409) that status (the reason as message), any other
    exception a 500 reply, never a dead scheduler."""
    fn = _OPS.get(req.op)
    if fn is None:
        return SpecOPDControlOutput(status=404, message=f"unknown specopd op {req.op!r}")
    try:
        status, message, payload = fn(scheduler, req.payload)
    except ValueError as exc:
        return SpecOPDControlOutput(status=400, message=str(exc))
    except Exception as exc:  # keep serving: report, do not crash the scheduler
        status = getattr(exc, "control_status", None)
        if status is not None:  # drafter.txn.TxnConflict (409): a rollout op against another transaction's state
            return SpecOPDControlOutput(status=status, message=str(exc))
        logger.error("specopd op %s failed:\n%s", req.op, traceback.format_exc())
        return SpecOPDControlOutput(status=500, message=f"{type(exc).__name__}: {exc}")
    return SpecOPDControlOutput(status=status, message=message, payload=payload)


def add_scheduler_dispatch(result, self, *args, **kwargs):
    """AFTER hook for ``Scheduler.init_request_dispatcher``: route SpecOPDControlReq to :func:`handle_control`."""
    TypeBasedDispatcher = compat.get("TypeBasedDispatcher")

    self._request_dispatcher += TypeBasedDispatcher([(SpecOPDControlReq, lambda r: handle_control(self, r))])
    return result


def _communicator(name: str):
    tm = compat.get("get_global_state")().tokenizer_manager
    tm.auto_create_handle_loop()
    return getattr(tm, f"{name}_communicator")


async def call(op_name: str, payload: bytes = b"") -> SpecOPDControlOutput:
    """HTTP side: send one op to the scheduler and await its reply."""
    results = await _communicator(COMMUNICATOR_NAME)(SpecOPDControlReq(op=op_name, payload=payload))
    return results[0]


async def call_score(payload: bytes) -> SpecOPDScoreOutput:
    """HTTP side: send one score_trees request (JSON bytes) to the scheduler's score queue and await its reply.
    The call is shielded: cancelling the caller does not cancel it (see the module docstring)."""
    import asyncio

    results = await asyncio.shield(_communicator(SCORE_COMMUNICATOR_NAME)(SpecOPDScoreReq(payload=payload)))
    return results[0]


def register_control() -> None:
    """Register the IPC types (every process), the communicator spec and the scheduler dispatch hook."""
    compat.get("hook_custom_types")(SpecOPDControlReq, SpecOPDControlOutput, SpecOPDScoreReq, SpecOPDScoreOutput)
    specs = compat.get("_COMMUNICATOR_SPECS")  # mutated in place: SGLang builds one communicator per entry
    for name, output_type in ((COMMUNICATOR_NAME, SpecOPDControlOutput), (SCORE_COMMUNICATOR_NAME, SpecOPDScoreOutput)):
        if not any(s[0] == name for s in specs):
            specs.append((name, output_type))
    compat.hook("Scheduler.init_request_dispatcher", add_scheduler_dispatch)
