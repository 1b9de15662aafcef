"""score_trees' hidden states and context features need the admin key (issue 54, item 5): the auth decision
(:mod:`sglang_specopd.server.scoring.auth`), the check inside the route's ``prepare``, the trainer client sending the
key, and the admin level of ``GET /specopd/traffic/features``. No server: the same route on the shared
``tiny_admin_server`` is checked in ``tests/test_score_trees.py``."""

from __future__ import annotations

import httpx
import pytest

from sglang_specopd.server.scoring import auth as score_auth
from sglang_specopd.server.scoring.admission import prepare
from sglang_specopd.server.scoring.auth import ScoreAuthError, checker, decide
from sglang_specopd.server.scoring.cost import ScoreSettings, TargetDims
from sglang_specopd.wire.protocol import ADMIN_KEY_HEADER, ScoreTreesRequest, privileged_parts

REF = {"input_ids": [1, 2, 3, 4, 5], "trees": [{"anchor": 2, "branches": [[6, 7]]}]}
DIMS = TargetDims(num_layers=3, hidden=8, intermediate=16, q_heads=2, kv_heads=2, head_dim=4, vocab=32, act_bytes=4)


def _req(**kw) -> ScoreTreesRequest:
    return ScoreTreesRequest(references=[REF], block_size=4, **kw)


def test_privileged_parts() -> None:
    assert privileged_parts(_req()) == [] and privileged_parts(_req(returns=["topk", "logprobs"])) == []
    assert privileged_parts(_req(returns=["hidden"], feature_layer_ids=[1])) == ["returns: hidden",
                                                                                 "feature_layer_ids"]


@pytest.mark.parametrize("api_key", [None, "user"])
def test_decide_needs_the_admin_key_on_an_admin_server(api_key) -> None:
    parts = ["returns: hidden"]
    kw = dict(api_key=api_key, admin_api_key="adm")
    assert decide([], authorization=None, admin_header=None, **kw) is None  # top-k: the route's normal auth
    status, reason = decide(parts, authorization=f"Bearer {api_key}" if api_key else None, admin_header=None, **kw)
    assert status == 401 and "admin key" in reason and ADMIN_KEY_HEADER in reason and "returns: hidden" in reason
    assert decide(parts, authorization=None, admin_header="wrong", **kw)[0] == 401
    assert decide(parts, authorization="Bearer user", admin_header="adm", **kw) is None
    # Bearer <admin key> unlocks it only where Authorization is not SGLang's --api-key
    assert (decide(parts, authorization="Bearer adm", admin_header=None, **kw) is None) == (api_key is None)


def test_decide_without_an_admin_key() -> None:
    status, reason = decide(["feature_layer_ids"], authorization="Bearer user", admin_header="x", api_key="user",
                            admin_api_key=None)
    assert status == 403 and "admin_api_key" in reason and "feature_layer_ids" in reason
    # a server without any key is open (as SGLang's ADMIN_OPTIONAL level on a server without keys)
    assert decide(["feature_layer_ids"], authorization=None, admin_header=None, api_key=None,
                  admin_api_key=None) is None


def test_prepare_refuses_hidden_and_features_without_the_admin_key(monkeypatch) -> None:
    monkeypatch.setattr(score_auth, "_KEYS", {"api_key": "user", "admin_api_key": "adm"})
    settings = ScoreSettings()
    user = checker(httpx.Headers({"Authorization": "Bearer user"}))
    admin = checker(httpx.Headers({"Authorization": "Bearer user", ADMIN_KEY_HEADER: "adm"}))
    plain = _req().model_dump_json().encode()
    assert prepare(plain, False, DIMS, settings, user) == (plain, None)
    for kw in ({"returns": ["hidden"]}, {"feature_layer_ids": [1]}):
        body = _req(**kw).model_dump_json().encode()
        with pytest.raises(ScoreAuthError) as err:
            prepare(body, False, DIMS, settings, user)
        assert err.value.status == 401 and "admin key" in err.value.message
        assert prepare(body, False, DIMS, settings, admin) == (body, None)


def test_configure_reads_the_server_args() -> None:
    class Args:
        api_key, admin_api_key = "u", ""

    saved = dict(score_auth._KEYS)
    try:
        score_auth.configure(Args())
        assert score_auth._KEYS == {"api_key": "u", "admin_api_key": None}
    finally:
        score_auth._KEYS.update(saved)


def test_client_sends_the_admin_key_only_for_hidden_and_features() -> None:
    from specopd_trainer.client.http import ServerRequestError, SpecOPDClient

    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers.get("authorization"), request.headers.get(ADMIN_KEY_HEADER)))
        return httpx.Response(403, json={"error": {"message": "stop here"}})

    c = SpecOPDClient("http://server", api_key="user", admin_api_key="adm", retries=0)
    c._http = httpx.Client(transport=httpx.MockTransport(handler), headers={"Authorization": "Bearer user"})
    for req in (_req(), _req(returns=["hidden"]), _req(feature_layer_ids=[0])):
        with pytest.raises(ServerRequestError):
            c.score_trees(req)
    assert seen == [("Bearer user", None), ("Bearer user", "adm"), ("Bearer user", "adm")]


def test_traffic_features_and_admin_routes_are_admin_force(monkeypatch) -> None:
    """``GET /specopd/traffic/features`` (and the other admin routes) carry SGLang's ADMIN_FORCE level; score_trees
    the normal one (its privileged parts are checked in the route)."""
    from sglang.srt.utils.auth import AuthLevel, auth_level

    from sglang_specopd.server import compat, routes
    from sglang_specopd.server.drafter import rollout_routes
    from sglang_specopd.server.http import guard as http_guard
    from sglang_specopd.wire.traffic import TRAFFIC_FEATURES_PATH

    class App:
        def __init__(self):
            self.routes, self.added = [], {}

        def add_api_route(self, path, endpoint, methods):
            self.added[(path, methods[0])] = endpoint

    app = App()
    table = {"http_server.app": app, "auth_level": auth_level, "AuthLevel": AuthLevel}
    monkeypatch.setattr(compat, "get", table.__getitem__)
    monkeypatch.setattr(http_guard, "install", lambda app: None)
    monkeypatch.setattr(rollout_routes, "configure", lambda: None)
    monkeypatch.setattr(score_auth, "_KEYS", dict(score_auth._KEYS))

    class Args:
        api_key, admin_api_key = None, "adm"

    routes.add_routes(Args())
    level = {k: getattr(v, "_auth_level", None) for k, v in app.added.items()}
    assert level[(TRAFFIC_FEATURES_PATH, "GET")] == AuthLevel.ADMIN_FORCE
    assert level[("/specopd/score_trees", "POST")] is None and score_auth._KEYS["admin_api_key"] == "adm"
