"""HTTP side of ``POST /specopd/score_trees``: admission, parsing off the event loop, the cost check, the call.

In order, before the scheduler sees anything:
  1. the body, read with bounds (:func:`sglang_specopd.server.http.body.read_body`): a declared ``Content-Length``
     or a body over ``SPECOPD_MAX_PAYLOAD_BYTES`` -> 413; a body that stalls or trickles past its time -> 408;
  2. a place in the line (:class:`sglang_specopd.server.scoring.line.ScoreLine`): at most ``score_trees_queue_max``
     requests wait while one is scored; more -> 429 with ``Retry-After`` (seconds: the expected time until a
     place is free, from the recent mean scoring time, at least 1);
  3. parsing and checks in a worker thread (``asyncio.to_thread``), in small pieces (:func:`parse_body`: one
     strict JSON parse of the body (:mod:`sglang_specopd.wire.strict_json`: nesting depth, NaN / Infinity,
     duplicate keys -> 400), then the models validated one anchor tree at a time), resting 1 ms after every
     2 ms of work and with the cyclic garbage collector paused, so ``/health`` and generation requests keep being
     served while a large body is parsed (pydantic validates a whole body in ONE call holding the GIL: measured
     0.25 s for a 2.9 MB body);
  3b. the admin key for ``returns: hidden`` / ``feature_layer_ids`` (:mod:`sglang_specopd.server.scoring.auth`)
     -> 401 / 403;
  4. the cost check (:mod:`sglang_specopd.server.scoring.cost`: tokens, nodes, anchors, returned and feature bytes,
     estimated peak scheduler memory against ``score_trees_max_request_mb``) -> 413 with the numbers;
  5. the request's turn: it waits at most ``score_trees_queue_wait_s`` for the requests ahead of it, else 429 with
     ``Retry-After``; the time it waited is in the reply header ``X-SpecOPD-Queue-Wait-S``;
  6. the scheduler call on the dedicated score communicator (:func:`sglang_specopd.server.control.call_score`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import threading
import time
from typing import Optional, Sequence, Tuple

from sglang_specopd.server.scoring.cost import ScoreSettings, TargetDims, estimate_cost, over_limits
from sglang_specopd.server.scoring.line import LineBusy, ScoreLine
from sglang_specopd.wire.protocol import (
    AnchorTree,
    ReferenceTrees,
    ScoreTreesError,
    ScoreTreesRequest,
    request_dict_from_binary,
    validate_request,
)


def validation_message(exc, prefix: Sequence = ()) -> str:
    """One line for a pydantic ValidationError: the first error's location (``prefix`` first) and message."""
    errors = exc.errors()
    loc = ".".join(str(p) for p in (*prefix, *errors[0]["loc"]))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"invalid score_trees request: {loc}: {errors[0]['msg']}{more}"


def _validate(model, obj, prefix: Sequence):
    from pydantic import ValidationError

    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise ScoreTreesError(validation_message(exc, prefix)) from None


class _Yielder:
    """Called once per anchor tree by the parsing thread: after every ``work_s`` of parsing it sleeps ``rest_s``,
    so the event loop's thread gets the GIL (otherwise it waits up to the 5 ms switch interval at every one of
    the many GIL re-acquisitions a request needs: a /health call took as long as a 1 s parse)."""

    def __init__(self, work_s: float = 0.002, rest_s: float = 0.001):
        self.work_s, self.rest_s = work_s, rest_s
        self.since = time.perf_counter()

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self.since >= self.work_s:
            time.sleep(self.rest_s)
            self.since = time.perf_counter()


_GC_LOCK = threading.Lock()
_GC_HOLDERS = 0


@contextlib.contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while a body is parsed (nested across threads). Parsing allocates
    hundreds of thousands of containers, which triggers full collections over the whole HTTP process's heap,
    each holding the GIL (measured 1.3 s per collection on the loaded 2-core CI machine: a /health stall).
    The parsed objects hold no cycles: reference counting frees them once the request is sent on."""
    global _GC_HOLDERS
    with _GC_LOCK:
        _GC_HOLDERS += 1
        if _GC_HOLDERS == 1:
            was_enabled = gc.isenabled()
            gc.disable()
            _GC_STATE["enabled"] = was_enabled
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_HOLDERS -= 1
            if _GC_HOLDERS == 0 and _GC_STATE["enabled"]:
                gc.enable()


_GC_STATE = {"enabled": True}


def parse_body(body: bytes, binary: bool, tick=None) -> ScoreTreesRequest:
    """The request in ``body`` (JSON, or the binary form when ``binary``), validated one anchor tree at a time,
    with the cyclic garbage collector paused (:func:`_gc_paused`).

    Raises ScoreTreesError (a ValueError) with a one-line reason: also for a body that is not strict JSON
    (:func:`sglang_specopd.wire.strict_json.loads`: not UTF-8 / not JSON, nested deeper than 32 levels, NaN or
    Infinity, a duplicate key). Equal to ``ScoreTreesRequest.model_validate_json(body)`` /
    ``request_from_binary(body)``."""
    with _gc_paused():
        return _parse_body(body, binary, tick or _Yielder())


def _parse_body(body: bytes, binary: bool, tick) -> ScoreTreesRequest:
    if binary:
        obj = request_dict_from_binary(body)
    else:
        from sglang_specopd.wire.strict_json import JSONBodyError, loads

        try:
            obj = loads(body, what="score_trees body")
        except JSONBodyError as exc:
            raise ScoreTreesError(f"invalid score_trees request: {exc}") from None
    refs = obj.get("references") if isinstance(obj, dict) else None
    if not isinstance(refs, list):
        return _validate(ScoreTreesRequest, obj, ())
    done = []
    for i, ref in enumerate(refs):
        trees = ref.get("trees") if isinstance(ref, dict) else None
        if isinstance(trees, list):
            done_trees = []
            for j, t in enumerate(trees):
                tick()
                done_trees.append(_validate(AnchorTree, t, ("references", i, "trees", j)))
            ref = {**ref, "trees": done_trees}
        done.append(_validate(ReferenceTrees, ref, ("references", i)))
    return _validate(ScoreTreesRequest, {**obj, "references": done}, ())


def prepare(body: bytes, binary: bool, dims: TargetDims, settings: ScoreSettings,
            authorize=None) -> Tuple[bytes, Optional[str]]:
    """Parse and check a body for the scheduler (run in a worker thread): ``(JSON payload, None)``, or
    ``(b"", reason)`` when it is over a limit (HTTP 413). Raises ScoreTreesError / ValidationError (HTTP 400),
    first of all for a target the endpoint cannot score (``dims.unscorable``, before any parsing), and whatever
    ``authorize(req)`` raises (:func:`sglang_specopd.server.scoring.auth.checker`: 401 / 403) right after parsing."""
    if dims.unscorable:
        raise ScoreTreesError(dims.unscorable)
    with _gc_paused():  # the checks walk every tree too (see parse_body)
        tick = _Yielder()
        req = parse_body(body, binary, tick)
        if authorize is not None:
            authorize(req)
        validate_request(req, vocab_size=dims.vocab, num_layers=dims.num_layers, tick=tick)
        too_big = over_limits(estimate_cost(req, dims, settings.budget_tokens), settings)
        if too_big:
            return b"", too_big
        return (req.model_dump_json().encode() if binary else body), None


_LINE: Optional[ScoreLine] = None
_DIMS: Optional[TargetDims] = None


def line() -> ScoreLine:
    """This HTTP process's score_trees line (``SPECOPD_SCORE_QUEUE_MAX`` places, ``SPECOPD_SCORE_QUEUE_WAIT_S``)."""
    global _LINE
    if _LINE is None:
        settings = ScoreSettings.from_env()
        _LINE = ScoreLine(settings.queue_max, settings.queue_wait_s)
    return _LINE


async def target_dims() -> TargetDims:
    """The served target's sizes (asked once from the scheduler with the ``score_dims`` op, then kept)."""
    global _DIMS
    if _DIMS is None:
        from sglang_specopd.server import control

        reply = await control.call("score_dims")
        if reply.status != 200:
            raise RuntimeError(f"score_dims failed: {reply.status} {reply.message}")
        _DIMS = TargetDims(**json.loads(reply.payload))
    return _DIMS


async def score_trees_route(request):
    """``POST /specopd/score_trees`` (see the module docstring for the order of checks)."""
    from fastapi.responses import Response

    from sglang_specopd.server import control
    from sglang_specopd.server.http.body import BodyError, read_body
    from sglang_specopd.server.http.errors import error_response
    from sglang_specopd.wire.protocol import BINARY_CONTENT_TYPE, QUEUE_WAIT_HEADER

    try:
        body = await read_body(request)
    except BodyError as exc:
        return exc.response()
    gate = line()
    try:
        ticket = gate.enter()
    except LineBusy as exc:
        return error_response(429, exc.message, headers={"Retry-After": str(exc.retry_after)})
    binary = request.headers.get("content-type", "").startswith(BINARY_CONTENT_TYPE)
    try:
        payload, refused = await _prepare(body, binary, request.headers)
    except BaseException:
        gate.leave(ticket)
        raise
    if refused is not None:
        gate.leave(ticket)
        return refused
    try:
        await gate.turn(ticket)  # gives the place back itself when it raises
    except LineBusy as exc:
        return error_response(429, exc.message, headers={"Retry-After": str(exc.retry_after),
                                                          QUEUE_WAIT_HEADER: f"{ticket.waited_s:.3f}"})
    waited = {QUEUE_WAIT_HEADER: f"{ticket.waited_s:.3f}"}
    t0 = time.monotonic()
    task = asyncio.ensure_future(control.call_score(payload))
    # the turn is given back when the scheduler answers, even if this handler is cancelled meanwhile
    task.add_done_callback(lambda t: gate.done(ticket, None if t.cancelled() or t.exception() is not None
                                               else time.monotonic() - t0))
    reply = await asyncio.shield(task)
    if reply.status != 200:
        return error_response(reply.status, reply.message, headers=waited)
    return Response(content=reply.payload, media_type=BINARY_CONTENT_TYPE, headers=waited)


async def _prepare(body: bytes, binary: bool, headers):
    """``(payload for the scheduler, None)`` or ``(b"", the 400 / 401 / 403 / 413 reply)``: :func:`prepare` in a
    thread."""
    from pydantic import ValidationError

    from sglang_specopd.server.http.errors import error_response
    from sglang_specopd.server.scoring.auth import ScoreAuthError, checker

    try:
        payload, too_big = await asyncio.to_thread(prepare, body, binary, await target_dims(),
                                                   ScoreSettings.from_env(), checker(headers))
    except ScoreAuthError as exc:
        return b"", error_response(exc.status, exc.message)
    except ValidationError as exc:
        return b"", error_response(400, validation_message(exc))
    except ValueError as exc:  # ScoreTreesError, a malformed binary payload, strict JSON
        return b"", error_response(400, str(exc))
    except RecursionError:  # backstop: a structure the strict checks let through yet too deep to walk
        return b"", error_response(400, "invalid score_trees request: nested too deeply")
    if too_big:
        return b"", error_response(413, too_big)
    return payload, None
