"""The plugin's control channel between SGLang's HTTP process and the scheduler.

One request type (:class:`SpecOPDControlReq`, an ``op`` name + opaque bytes) and one reply type travel over
SGLang's own zmq IPC (msgspec structs registered with ``hook_custom_types`` in every process). The HTTP side uses
a ``FanOutCommunicator`` created by SGLang's tokenizer manager from ``_COMMUNICATOR_SPECS`` (queueing: one op
in flight at a time); the scheduler runs the op between batches in its event loop, so an op never races a
forward. Ops: ``score_trees`` (:mod:`sglang_specopd.server.scoring`), ``drafter_info``.
"""

from __future__ import annotations

import logging
import traceback
from typing import Callable, Dict

from sglang_specopd.server import compat

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


_OPS: Dict[str, Callable] = {}


def op(name: str):
    """Register a scheduler-side op: ``fn(scheduler, payload: bytes) -> (status, message, payload)``."""

    def deco(fn):
        _OPS[name] = fn
        return fn

    return deco


def handle_control(scheduler, req: SpecOPDControlReq) -> SpecOPDControlOutput:
    """Run one op in the scheduler; any exception becomes a 500 reply, never a dead scheduler."""
    fn = _OPS.get(req.op)
    if fn is None:
        return SpecOPDControlOutput(status=404, message=f"unknown specopd op {req.op!r}")
    try:
        status, message, payload = fn(scheduler, req.payload)
    except ValueError as exc:
        return SpecOPDControlOutput(status=400, message=str(exc))
    except Exception as exc:  # keep serving: report, do not crash the scheduler
        logger.error("specopd op %s failed:\n%s", req.op, traceback.format_exc())
        return SpecOPDControlOutput(status=500, message=f"{type(exc).__name__}: {exc}")
    return SpecOPDControlOutput(status=status, message=message, payload=payload)


def add_scheduler_dispatch(result, self, *args, **kwargs):
    """AFTER hook for ``Scheduler.init_request_dispatcher``: route SpecOPDControlReq to :func:`handle_control`."""
    TypeBasedDispatcher = compat.get("TypeBasedDispatcher")

    self._request_dispatcher += TypeBasedDispatcher([(SpecOPDControlReq, lambda r: handle_control(self, r))])
    return result


async def call(op_name: str, payload: bytes = b"") -> SpecOPDControlOutput:
    """HTTP side: send one op to the scheduler and await its reply."""
    tm = compat.get("get_global_state")().tokenizer_manager
    tm.auto_create_handle_loop()
    comm = getattr(tm, f"{COMMUNICATOR_NAME}_communicator")
    results = await comm(SpecOPDControlReq(op=op_name, payload=payload))
    return results[0]


def register_control() -> None:
    """Register the IPC types (every process), the communicator spec and the scheduler dispatch hook."""
    compat.get("hook_custom_types")(SpecOPDControlReq, SpecOPDControlOutput)
    specs = compat.get("_COMMUNICATOR_SPECS")  # mutated in place: SGLang builds one communicator per entry
    if not any(s[0] == COMMUNICATOR_NAME for s in specs):
        specs.append((COMMUNICATOR_NAME, SpecOPDControlOutput))
    compat.hook("Scheduler.init_request_dispatcher", add_scheduler_dispatch)
