"""The drafter routes' handlers: ``POST /specopd/drafter/swap``, ``GET /specopd/drafter`` and its admin view.

* swap (admin; SGLang's auth middleware checks the key before this runs): the body is streamed to a file with
  bounds (:mod:`sglang_specopd.server.drafter.upload`: 413 over ``drafter_max_payload_mb``, 408 for a stalled
  body); a JSON body (one starting with ``{``: ``{"path": DIR, "version": str}``) is parsed strictly here
  (:func:`sglang_specopd.wire.strict_json.loads`: nesting depth, NaN / Infinity, duplicate keys) before the
  scheduler sees it; a safetensors body is checked in the scheduler (:mod:`sglang_specopd.server.drafter.swap`);
* ``GET /specopd/drafter`` (normal auth: any API-key holder) gives names and versions only: ``version``, ``swaps``,
  ``has_drafter``, ``arch``, ``spec``, ``name`` (the start-up checkpoint directory's name) and ``target`` (the
  served target's fingerprint and dtype, :mod:`sglang_specopd.server.target_identity`), never a server filesystem
  path (issue 41);
* ``GET /specopd/drafter/admin`` (admin key, SGLang's ADMIN_FORCE level) adds ``path``: the start-up checkpoint's
  directory on the server, what a trainer starts from when it is given no ``--init``.
"""

from __future__ import annotations

import json
from pathlib import PurePath

from sglang_specopd.server.http.errors import error_response


def public_drafter_info(info: dict) -> dict:
    """``info`` (the ``drafter_info`` op's reply) without server paths: ``path`` becomes ``name``, its last part."""
    out = {k: v for k, v in info.items() if k != "path"}
    if info.get("path"):
        out["name"] = PurePath(str(info["path"])).name
    return out


def swap_json_problem(body: bytes):
    """The reason a JSON swap body is refused before the scheduler sees it, or None (also for a binary body)."""
    from sglang_specopd.wire.strict_json import JSONBodyError, loads

    if body[:1] != b"{":
        return None  # safetensors bytes: decoded and checked by the swap op
    try:
        loads(body, what="the swap body")
    except JSONBodyError as exc:
        return f"refused: {exc}"
    return None


async def _op(op_name: str, payload: bytes = b""):
    from sglang_specopd.server import control

    return await control.call(op_name, payload)


async def call_with_drafter_body(request, send):
    """Receive a swap / stage body (streamed to a file with bounds, :mod:`sglang_specopd.server.drafter.upload`),
    refuse an empty or malformed one (400), and return ``(await send(body), None)``, or ``(None, refusal)`` with the
    4xx response; the uploaded file is removed once ``send`` has answered."""
    from sglang_specopd.server.drafter import upload as drafter_upload
    from sglang_specopd.server.http.body import BodyError

    try:
        body, upload = await drafter_upload.receive(request)
    except BodyError as exc:
        return None, exc.response()
    try:
        if not body:
            return None, error_response(400, drafter_upload.EMPTY_BODY)
        problem = swap_json_problem(body)
        if problem:
            return None, error_response(400, problem)
        return await send(body), None
    finally:
        drafter_upload.discard(upload)


async def swap_drafter(request):
    """Admin: swap the serving drafter (see the module docstring); 200 JSON or 4xx with the reason."""
    from fastapi.responses import Response

    reply, refused = await call_with_drafter_body(request, lambda body: _op("swap_drafter", body))
    if refused is not None:
        return refused
    if reply.status != 200:
        return error_response(reply.status, reply.message)
    return Response(content=reply.payload, media_type="application/json")


async def _drafter_info(public: bool):
    from fastapi.responses import JSONResponse

    reply = await _op("drafter_info")
    if reply.status != 200:
        return error_response(reply.status, reply.message)
    info = json.loads(reply.payload)
    return JSONResponse(public_drafter_info(info) if public else info)


async def drafter_info(request):
    """Version, swap count, architecture, spec and name of the serving drafter (no server paths)."""
    return await _drafter_info(public=True)


async def drafter_admin_info(request):
    """Admin: :func:`drafter_info` plus ``path``, the start-up checkpoint's directory on the server."""
    return await _drafter_info(public=False)
