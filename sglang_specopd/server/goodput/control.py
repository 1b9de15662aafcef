"""``GET /specopd/policy`` (the speculative policy's statistics) and ``POST /specopd/policy`` (admin: new settings).

Both go to the scheduler through the plugin's control channel (op ``speculative_policy``, run between batches):
an empty payload reads :class:`~sglang_specopd.wire.policy.PolicyStats`, a :class:`PolicySettings` JSON payload
replaces the settings (every estimate starts again) and returns the new (empty) statistics. 404 on a server
whose speculative worker is not SPECOPD's DFlash worker (plain serving, DSpark drafters).
"""

from __future__ import annotations

from fastapi import Request

from sglang_specopd.server import compat
from sglang_specopd.server.control import op
from sglang_specopd.server.http.errors import error_response, max_payload_bytes
from sglang_specopd.wire.policy import POLICY_PATH, PolicySettings

OP_NAME = "speculative_policy"


@op(OP_NAME)
def policy_op(scheduler, payload: bytes):
    """Scheduler side: stats (empty payload) or new settings (PolicySettings JSON; ValueError -> 400)."""
    from sglang_specopd.server.goodput.step import controller_for

    worker = getattr(scheduler, "draft_worker", None)
    if worker is None or not hasattr(worker, "_specopd_step"):
        return 404, "this server has no SPECOPD DFlash worker (the speculative policy applies to it only)", b""
    ctl = controller_for(worker)
    if payload:
        try:
            settings = PolicySettings.model_validate_json(payload)
        except Exception as exc:
            raise ValueError(f"bad policy settings: {exc}") from None
        if settings.cost_curve_ms is not None:
            width = len(next(iter(settings.cost_curve_ms.values())))
            if width != ctl.block:
                raise ValueError(f"cost_curve_ms needs {ctl.block} values per batch size (k = 0..{ctl.block - 1}), "
                                 f"got {width}")
        ctl.reset(settings)
    return 200, "", ctl.stats().model_dump_json().encode()


async def _call(payload: bytes = b""):
    from fastapi.responses import Response

    from sglang_specopd.server import control

    reply = await control.call(OP_NAME, payload)
    if reply.status != 200:
        return error_response(reply.status, reply.message)
    return Response(content=reply.payload, media_type="application/json")


async def policy_stats(request: Request):
    """The serving policy, its chosen-k histogram, cost curve, acceptance estimate and step-time breakdown."""
    return await _call()


async def policy_set(request: Request):
    """Admin: replace the policy's settings (a PolicySettings JSON body)."""
    body = await request.body()
    if len(body) > max_payload_bytes():
        return error_response(413, f"payload of {len(body)} bytes exceeds the limit of {max_payload_bytes()} bytes")
    if not body:
        return error_response(400, "empty body: send PolicySettings JSON, e.g. {\"policy\": \"goodput\"}")
    return await _call(body)


def add_policy_routes(*args, **kwargs):
    """BEFORE hook for ``http_server.launch_server``: add the policy routes to SGLang's app."""
    app = compat.get("http_server.app")
    if not any(getattr(r, "path", None) == POLICY_PATH and "GET" in getattr(r, "methods", ()) for r in app.routes):
        app.add_api_route(POLICY_PATH, policy_stats, methods=["GET"])
        app.add_api_route(POLICY_PATH, compat.get("auth_level")(compat.get("AuthLevel").ADMIN_FORCE)(policy_set),
                          methods=["POST"])
    return None


def register_policy_routes() -> None:
    """Register the routes' hook (every process; only the HTTP server's launch runs it)."""
    compat.hook("launch_server", add_policy_routes)
