"""HTTP handlers of the two-phase drafter swap: ``POST /specopd/drafter/stage|commit|abort`` (admin key; SGLang's
auth middleware checks it before these run). The wire format is :mod:`sglang_specopd.wire.rollout`; the scheduler
side :mod:`sglang_specopd.server.drafter.rollout`.

Bounds before the scheduler sees anything: the stage query (:func:`~sglang_specopd.wire.rollout.parse_stage_query`),
the stage body read as a swap body is (:mod:`~sglang_specopd.server.drafter.upload`: streamed to a file, 413 / 408;
a JSON body such as ``{"path": DIR}`` parsed strictly, :func:`~sglang_specopd.server.drafter.routes.swap_json_problem`),
a commit / abort body of at most :data:`~sglang_specopd.wire.rollout.TXN_BODY_MAX_BYTES` bytes of strict JSON
``{"txn": ID}``. Every refusal is a 4xx JSON error with the reason (:func:`~sglang_specopd.server.http.errors.error_response`).

Expiry: after a successful stage an asyncio timer in this (HTTP) process sends the ``expire_drafter`` op at the
deadline, so a staged copy nobody commits or aborts is dropped on time (and its device memory freed); the scheduler
checks the deadline itself at every op, so a late timer never lets an expired transaction commit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Optional, Set

from sglang_specopd.server.http.errors import error_response

logger = logging.getLogger("sglang_specopd.server.drafter.rollout_routes")

_TIMERS: Set[asyncio.Task] = set()  # expiry tasks in flight (a reference keeps them from being collected)
_DEFAULT_TTL: dict = {}
_EXPIRY_SLACK_S = 0.05


def configure(environ=None) -> float:
    """Read ``SPECOPD_STAGE_TTL_S`` (at route registration: a bad value stops the server's start with the reason)
    and return the default stage timeout in seconds."""
    from sglang_specopd.wire.rollout import default_ttl

    _DEFAULT_TTL["s"] = default_ttl(os.environ if environ is None else environ)
    return _DEFAULT_TTL["s"]


def _json(reply):
    from fastapi.responses import Response

    if reply.status != 200:
        return error_response(reply.status, reply.message)
    return Response(content=reply.payload, media_type="application/json")


async def _call(op_name: str, payload: bytes):
    from sglang_specopd.server import control

    return await control.call(op_name, payload)


def _schedule_expiry(txn: str, delay_s: float) -> None:
    async def fire() -> None:
        await asyncio.sleep(max(0.0, delay_s) + _EXPIRY_SLACK_S)
        try:
            reply = await _call("expire_drafter", json.dumps({"txn": txn}).encode())
        except Exception:  # the server is shutting down: nothing to free
            logger.warning("expiry of staged transaction %s failed", txn, exc_info=True)
            return
        left: Optional[float] = json.loads(reply.payload).get("expires_in_s") if reply.status == 200 else None
        if left is not None and left > 0:  # re-staged under the same txn since: its new deadline
            _schedule_expiry(txn, left)

    task = asyncio.ensure_future(fire())
    _TIMERS.add(task)
    task.add_done_callback(_TIMERS.discard)


async def stage_drafter(request):
    """Admin: validate a drafter (a swap body) and stage it under ``?txn=ID`` for ``ttl_s`` seconds; 200
    :class:`~sglang_specopd.wire.rollout.StageReply`, 400 / 408 / 413 with the reason, 409 while another
    transaction is staged."""
    from sglang_specopd.server.drafter.routes import call_with_drafter_body
    from sglang_specopd.wire.rollout import parse_stage_query, stage_op_payload

    try:
        params = parse_stage_query(request.query_params, _DEFAULT_TTL.get("s") or configure())
    except ValueError as exc:
        return error_response(400, f"refused: {exc}")
    reply, refused = await call_with_drafter_body(
        request, lambda body: _call("stage_drafter", stage_op_payload(params, body)))
    if refused is not None:
        return refused
    if reply.status == 200:
        _schedule_expiry(params.txn, params.ttl_s)
    return _json(reply)


async def _txn_route(request, op_name: str):
    from sglang_specopd.server.http.body import BodyError, read_body
    from sglang_specopd.wire.rollout import TXN_BODY_MAX_BYTES, parse_txn_body

    try:
        body = await read_body(request, limit=TXN_BODY_MAX_BYTES)
    except BodyError as exc:
        return exc.response()
    try:
        txn = parse_txn_body(body)
    except ValueError as exc:
        return error_response(400, f"refused: {exc}")
    return _json(await _call(op_name, json.dumps({"txn": txn}).encode()))


async def commit_drafter(request):
    """Admin: ``{"txn": ID}`` -> the staged drafter serves; 200 :class:`~sglang_specopd.wire.rollout.CommitReply`,
    400 for a bad body, 409 when ``txn`` is not staged (with why: expired, aborted, another one staged)."""
    return await _txn_route(request, "commit_drafter")


async def abort_drafter(request):
    """Admin: ``{"txn": ID}`` -> its staged copy is dropped; 200 :class:`~sglang_specopd.wire.rollout.AbortReply`
    (also when it was not staged), 400 for a bad body."""
    return await _txn_route(request, "abort_drafter")
