"""HTTP side of ``POST /specopd/score_trees``: admission, parsing off the event loop, the cost check, the call.

In order, before the scheduler sees anything:
  1. body size: a declared ``Content-Length`` or a body over ``SPECOPD_MAX_PAYLOAD_BYTES`` -> 413;
  2. the bounded queue (:class:`Admission`): at most ``score_trees_queue_max`` requests wait while one is scored;
     more -> 429 with ``Retry-After`` (seconds: the recent mean time of a scored request, at least 1);
  3. parsing and checks in a worker thread (``asyncio.to_thread``), in small pieces (:func:`parse_body`: one
     ``json.loads`` of the body, then the models validated one anchor tree at a time), resting 1 ms after every
     2 ms of work and with the cyclic garbage collector paused, so ``/health`` and generation requests keep being
     served while a large body is parsed (pydantic validates a whole body in ONE call holding the GIL: measured
     0.25 s for a 2.9 MB body);
  4. the cost check (:mod:`sglang_specopd.server.score_cost`: tokens, nodes, anchors, returned and feature bytes,
     estimated peak scheduler memory against ``score_trees_max_request_mb``) -> 413 with the numbers;
  5. the scheduler call on the dedicated score communicator (:func:`sglang_specopd.server.control.call_score`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import threading
import time
from typing import Optional, Sequence, Tuple

from sglang_specopd.server.score_cost import ScoreSettings, TargetDims, estimate_cost, over_limits
from sglang_specopd.wire.protocol import (
    AnchorTree,
    ReferenceTrees,
    ScoreTreesError,
    ScoreTreesRequest,
    request_dict_from_binary,
    validate_request,
)


class Admission:
    """Counts the score requests this HTTP process holds (waiting or being scored): at most ``queue_max`` + 1."""

    def __init__(self, queue_max: int):
        self.queue_max = queue_max
        self.active = 0
        self.mean_s: Optional[float] = None  # exponential mean of recent scored requests' durations

    def enter(self) -> Optional[int]:
        """Take a place: None when admitted, else the ``Retry-After`` seconds to answer with a 429."""
        if self.active >= self.queue_max + 1:
            return self.retry_after()
        self.active += 1
        return None

    def leave(self, scored_s: Optional[float] = None) -> None:
        """Give the place back; ``scored_s``: how long the scheduler took, when it scored the request."""
        self.active -= 1
        if scored_s is not None:
            self.mean_s = scored_s if self.mean_s is None else 0.7 * self.mean_s + 0.3 * scored_s

    def retry_after(self) -> int:
        """Seconds until a place is likely free: the running request's expected time, at least 1."""
        return max(1, math.ceil(self.mean_s or 1.0))


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

    Raises ScoreTreesError (a ValueError) with a one-line reason, or pydantic's ValidationError for a body that is
    not JSON. Equal to ``ScoreTreesRequest.model_validate_json(body)`` / ``request_from_binary(body)``."""
    with _gc_paused():
        return _parse_body(body, binary, tick or _Yielder())


def _parse_body(body: bytes, binary: bool, tick) -> ScoreTreesRequest:
    if binary:
        obj = request_dict_from_binary(body)
    else:
        try:
            obj = json.loads(body)
        except ValueError:
            return ScoreTreesRequest.model_validate_json(body)  # raises the models' own "Invalid JSON" error
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


def prepare(body: bytes, binary: bool, dims: TargetDims, settings: ScoreSettings) -> Tuple[bytes, Optional[str]]:
    """Parse and check a body for the scheduler (run in a worker thread): ``(JSON payload, None)``, or
    ``(b"", reason)`` when it is over a limit (HTTP 413). Raises ScoreTreesError / ValidationError (HTTP 400),
    first of all for a target the endpoint cannot score (``dims.unscorable``, before any parsing)."""
    if dims.unscorable:
        raise ScoreTreesError(dims.unscorable)
    with _gc_paused():  # the checks walk every tree too (see parse_body)
        tick = _Yielder()
        req = parse_body(body, binary, tick)
        validate_request(req, vocab_size=dims.vocab, num_layers=dims.num_layers, tick=tick)
        too_big = over_limits(estimate_cost(req, dims, settings.budget_tokens), settings)
        if too_big:
            return b"", too_big
        return (req.model_dump_json().encode() if binary else body), None


_ADMISSION: Optional[Admission] = None
_DIMS: Optional[TargetDims] = None


def admission() -> Admission:
    """This HTTP process's admission counter (queue size from ``SPECOPD_SCORE_QUEUE_MAX``)."""
    global _ADMISSION
    if _ADMISSION is None:
        _ADMISSION = Admission(ScoreSettings.from_env().queue_max)
    return _ADMISSION


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
    from pydantic import ValidationError

    from sglang_specopd.server import control
    from sglang_specopd.server.http_errors import error_response, max_payload_bytes
    from sglang_specopd.wire.protocol import BINARY_CONTENT_TYPE

    limit = max_payload_bytes()
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return error_response(413, f"payload of {declared} bytes exceeds the limit of {limit} bytes")
    body = await request.body()
    if len(body) > limit:
        return error_response(413, f"payload of {len(body)} bytes exceeds the limit of {limit} bytes")
    gate = admission()
    retry = gate.enter()
    if retry is not None:
        return error_response(429, f"score_trees queue is full ({gate.queue_max} waiting and one being scored); "
                                   f"retry in {retry} s", headers={"Retry-After": str(retry)})
    scored_s = None
    try:
        binary = request.headers.get("content-type", "").startswith(BINARY_CONTENT_TYPE)
        try:
            payload, too_big = await asyncio.to_thread(prepare, body, binary, await target_dims(),
                                                       ScoreSettings.from_env())
        except ValidationError as exc:
            return error_response(400, validation_message(exc))
        except ValueError as exc:  # ScoreTreesError, a malformed binary payload
            return error_response(400, str(exc))
        if too_big:
            return error_response(413, too_big)
        t0 = time.monotonic()
        reply = await control.call_score(payload)
        scored_s = time.monotonic() - t0
    finally:
        gate.leave(scored_s)
    if reply.status != 200:
        return error_response(reply.status, reply.message)
    return Response(content=reply.payload, media_type=BINARY_CONTENT_TYPE)
