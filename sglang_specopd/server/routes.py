"""HTTP routes the plugin adds to SGLang's FastAPI app (added by a BEFORE hook on ``launch_server``).

``POST /specopd/drafter/swap`` (admin: SGLang's ADMIN_FORCE level, so ``--admin-api-key`` is required and
checked by SGLang's own auth middleware), ``POST /specopd/drafter/stage``, ``/commit`` and ``/abort`` (admin, as
the swap: the two-phase swap of a fleet rollout, :mod:`sglang_specopd.server.drafter.rollout_routes`), ``GET /specopd/drafter`` (version, spec and name of the serving drafter,
no server paths) and ``GET /specopd/drafter/admin`` (admin: the same plus its checkpoint path), in
:mod:`sglang_specopd.server.drafter.routes`.
``GET /specopd/prefix_cache`` (the score_trees prefix cache's stats) and ``POST /specopd/prefix_cache/clear``
(admin, as the swap). ``GET /specopd/traffic`` and ``POST /specopd/traffic/purge`` (admin, as the swap): the
live-traffic spool (:mod:`sglang_specopd.server.traffic.spool`; 404 with the reason when recording is off), and
``GET /specopd/traffic/features`` (admin): the context features captured while serving those items
(:mod:`sglang_specopd.server.traffic.features`).

``POST /specopd/score_trees`` (normal auth: SGLang's ``--api-key`` when set; ``returns: hidden`` and
``feature_layer_ids`` need the admin key too, :mod:`sglang_specopd.server.scoring.auth`): a JSON :class:`ScoreTreesRequest`;
the reply is ``application/octet-stream`` safetensors bytes (tensors per reference ``ref{i}.*``, JSON header in
the metadata, decode with :func:`sglang_specopd.wire.protocol.decode_tensors`). Bad input gets HTTP 400/413/422 with a
reason and the server keeps serving. Payload limit: ``SPECOPD_MAX_PAYLOAD_BYTES`` (default 64 MiB; drafter pushes:
the server config key ``drafter_max_payload_mb``, :mod:`sglang_specopd.server.drafter.upload`). A full
score queue answers 429 with ``Retry-After``; a request over the cost limits 413 with its numbers
(:mod:`sglang_specopd.server.scoring.admission`).
"""

from __future__ import annotations

from fastapi import Request

from sglang_specopd.server import compat
from sglang_specopd.server.http.errors import error_response
from sglang_specopd.wire.protocol import (
    DRAFTER_ADMIN_INFO_PATH,
    DRAFTER_INFO_PATH,
    PREFIX_CACHE_PATH,
    SCORE_TREES_PATH,
    SWAP_DRAFTER_PATH,
)
from sglang_specopd.wire.traffic import TRAFFIC_FEATURES_PATH, TRAFFIC_PATH, TRAFFIC_PURGE_PATH


async def score_trees(request: Request):
    """Tree scoring (:mod:`sglang_specopd.server.scoring.admission`: 413 / 429 / 400 checks, then the scheduler)."""
    from sglang_specopd.server.metrics.hooks import observe_score_trees
    from sglang_specopd.server.scoring.admission import line, score_trees_route

    return await observe_score_trees(score_trees_route, request, line)  # counted when --enable-metrics


async def swap_drafter(request: Request):
    """Admin: swap the serving drafter's weights (see :mod:`sglang_specopd.server.drafter.swap`); 200 JSON or 4xx reason."""
    from sglang_specopd.server.drafter import routes as drafter_routes

    return await drafter_routes.swap_drafter(request)


async def _json_op(op_name: str, payload: bytes = b""):
    """Run a scheduler op whose reply payload is JSON: 200 with those bytes as they are, or the op's status and
    reason."""
    from fastapi.responses import Response

    from sglang_specopd.server import control

    reply = await control.call(op_name, payload)
    if reply.status != 200:
        return error_response(reply.status, reply.message)
    return Response(content=reply.payload, media_type="application/json")


async def drafter_info(request: Request):
    """The serving drafter's version, swap count, spec and name (no server paths)."""
    from sglang_specopd.server.drafter import routes as drafter_routes

    return await drafter_routes.drafter_info(request)


async def drafter_admin_info(request: Request):
    """Admin: :func:`drafter_info` plus the checkpoint's server path."""
    from sglang_specopd.server.drafter import routes as drafter_routes

    return await drafter_routes.drafter_admin_info(request)


async def prefix_cache_stats(request: Request):
    """The score_trees prefix cache: entries, bytes, budget, hits, misses, evictions."""
    return await _json_op("prefix_cache")


async def prefix_cache_clear(request: Request):
    """Admin: empty the score_trees prefix cache (frees its memory; a benchmark's cold start); returns the stats."""
    return await _json_op("prefix_cache", b"clear")


async def traffic_read(request: Request):
    """Admin: live-traffic items after a cursor (``?after=SEQ&max_items=N&spool_id=ID``); 400 for a bad query."""
    import json

    from sglang_specopd.server.traffic.spool import parse_read_query

    try:
        query = parse_read_query(request.query_params)
    except ValueError as exc:
        return error_response(400, str(exc))
    return await _json_op("traffic", json.dumps({"action": "read", **query}).encode())


async def traffic_features_read(request: Request):
    """Admin: the context features captured while serving items ``?seqs=1,2,..&spool_id=ID`` (safetensors bytes,
    :func:`sglang_specopd.server.traffic.features.features_reply`); 400 for a bad query, 404 when capture is off,
    409 for another spool's id."""
    import json

    from fastapi.responses import Response

    from sglang_specopd.server import control
    from sglang_specopd.server.traffic.features import parse_seqs

    try:
        seqs, spool_id = parse_seqs(request.query_params)
    except ValueError as exc:
        return error_response(400, str(exc))
    reply = await control.call("traffic", json.dumps({"action": "features", "seqs": seqs,
                                                      "spool_id": spool_id}).encode())
    if reply.status != 200:
        return error_response(reply.status, reply.message)
    return Response(content=reply.payload, media_type="application/octet-stream")


async def traffic_purge(request: Request):
    """Admin: drop every live-traffic item; ``{"purged": n, "stats": {...}}``."""
    return await _json_op("traffic", b'{"action": "purge"}')


def _add_rollout_routes(app, admin) -> None:
    """``POST /specopd/drafter/stage|commit|abort`` (admin, as the swap): the two-phase swap of a fleet rollout
    (:mod:`sglang_specopd.server.drafter.rollout_routes`); reads ``SPECOPD_STAGE_TTL_S`` now (a bad value stops the start)."""
    from sglang_specopd.server.drafter import rollout_routes
    from sglang_specopd.wire.rollout import ABORT_DRAFTER_PATH, COMMIT_DRAFTER_PATH, STAGE_DRAFTER_PATH

    rollout_routes.configure()

    async def stage(request: Request):
        return await rollout_routes.stage_drafter(request)

    async def commit(request: Request):
        return await rollout_routes.commit_drafter(request)

    async def abort(request: Request):
        return await rollout_routes.abort_drafter(request)

    for path, handler in ((STAGE_DRAFTER_PATH, stage), (COMMIT_DRAFTER_PATH, commit), (ABORT_DRAFTER_PATH, abort)):
        app.add_api_route(path, admin(handler), methods=["POST"])


def add_routes(*args, **kwargs):
    """BEFORE hook for ``http_server.launch_server``: add the plugin's routes to SGLang's app, and guard its
    connections (:mod:`sglang_specopd.server.http.guard`)."""
    from sglang_specopd.server.http import guard as http_guard

    from sglang_specopd.server.scoring import auth as score_auth

    app = compat.get("http_server.app")
    http_guard.install(app)
    server_args = args[0] if args else kwargs.get("server_args")
    score_auth.configure(server_args)
    from sglang_specopd.server.metrics.hooks import configure_http

    configure_http(server_args)  # the score_trees series (docs/metrics.md), with SGLang's --enable-metrics
    from sglang_specopd.server.drafter.upload import drafter_limit

    drafter_limit()  # a bad SPECOPD_DRAFTER_MAX_PAYLOAD_MB (drafter_max_payload_mb) stops the start with the reason
    auth_level, admin_force = compat.get("auth_level"), compat.get("AuthLevel").ADMIN_FORCE

    if not any(getattr(r, "path", None) == SCORE_TREES_PATH for r in app.routes):
        app.add_api_route(SCORE_TREES_PATH, score_trees, methods=["POST"])
        # ADMIN_FORCE: SGLang's auth middleware requires --admin-api-key (403 when none is configured).
        app.add_api_route(SWAP_DRAFTER_PATH, auth_level(admin_force)(swap_drafter), methods=["POST"])
        app.add_api_route(DRAFTER_INFO_PATH, drafter_info, methods=["GET"])
        _add_rollout_routes(app, auth_level(admin_force))
        app.add_api_route(DRAFTER_ADMIN_INFO_PATH, auth_level(admin_force)(drafter_admin_info), methods=["GET"])
        app.add_api_route(PREFIX_CACHE_PATH, prefix_cache_stats, methods=["GET"])
        app.add_api_route(PREFIX_CACHE_PATH + "/clear", auth_level(admin_force)(prefix_cache_clear),
                          methods=["POST"])
        app.add_api_route(TRAFFIC_PATH, auth_level(admin_force)(traffic_read), methods=["GET"])
        app.add_api_route(TRAFFIC_PURGE_PATH, auth_level(admin_force)(traffic_purge), methods=["POST"])
        app.add_api_route(TRAFFIC_FEATURES_PATH, auth_level(admin_force)(traffic_features_read), methods=["GET"])
    return None


def register_routes() -> None:
    compat.hook("launch_server", add_routes)
