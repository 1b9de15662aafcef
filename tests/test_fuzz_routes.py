"""Property-based fuzz of the plugin's routes on ONE tiny SPECOPD server (strategies: ``benchmarks/fuzz_routes/run.py``).

score_trees (JSON and binary), drafter swap (with and without the admin key), prefix-cache stats/clear,
generation with random ``custom_params`` trace values, and the crafted hostile kinds of ``benchmarks/fuzz_routes/crafted.py``
(deep nesting, huge / negative integers, NaN / Infinity, duplicate keys, truncated bodies, wrong content types, slow
and stalled bodies, early answers to ``Connection: close`` uploads): every request gets an HTTP answer (no reset, no
timeout) that is < 500 and well-formed, unauthorised admin calls are 401, and afterwards the server is healthy and
a fixed greedy probe returns the same tokens as before.
Examples over all routes: ``SPECOPD_FUZZ_EXAMPLES`` (default 150, derandomized, no deadline); the recorded
10,000-example run is ``benchmarks/results/fuzz_routes_cpu.json``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Tuple

import pytest

from conftest import RunningServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from fuzz_routes import run as fuzz  # noqa: E402  (the runner module: in sys.modules as fuzz_routes.run)


@pytest.fixture(scope="module")
def fuzz_target(tiny_admin_server: RunningServer, tiny_serving_target: Path,
                tiny_drafter: Path) -> Tuple[RunningServer, object]:
    """The tiny SPECOPD server (conftest's shared ``tiny_admin_server``: the admin key the strategies send, a
    prefix cache, as :func:`fuzz_routes.fuzz_launch_spec` asks for) and the fuzz strategies' view of it."""
    srv = tiny_admin_server
    wanted = fuzz.fuzz_launch_spec(srv.spec)
    assert srv.spec.admin_api_key == wanted.admin_api_key and srv.spec.prefix_cache_mb > 0, srv.spec
    return srv, fuzz.target_for(srv.url, tiny_serving_target, tiny_drafter)


def test_examples_split_over_every_route() -> None:
    split = fuzz.examples_per_route(10_000)
    assert set(split) == set(fuzz.STRATEGIES) and sum(split.values()) == 10_000
    assert all(n >= 1 for n in fuzz.examples_per_route(1).values())
    from fuzz_routes.crafted import KINDS

    kinds = fuzz.crafted_split(split["crafted"])
    assert set(kinds) == set(KINDS) >= {"deep_nesting", "huge_ints", "negative_ints", "nan_infinity",
                                         "duplicate_keys", "truncated", "wrong_content_type", "slow_body",
                                         "stalled_body", "early_close"}
    assert abs(sum(kinds.values()) - split["crafted"]) <= len(kinds) and kinds["deep_nesting"] >= 300


def test_tally_counts_kinds_resets_and_timeouts() -> None:
    import httpx

    tally = fuzz.Tally()
    tally.add("score_trees_json", 400)
    tally.add("crafted", 400, "deep_nesting")
    tally.add("crafted", fuzz.no_answer_kind(httpx.ReadError("[Errno 104] Connection reset by peer")), "slow_body")
    tally.add("crafted", fuzz.no_answer_kind(httpx.ReadTimeout("timed out")), "stalled_body")
    tally.add("swap", fuzz.no_answer_kind(httpx.RemoteProtocolError("Server disconnected without sending a response")))
    s = tally.summary()
    assert s["examples"] == {"score_trees_json": 1, "deep_nesting": 1, "slow_body": 1, "stalled_body": 1, "swap": 1}
    assert s["examples_by_route"] == {"score_trees_json": 1, "crafted": 3, "swap": 1}
    assert s["connection_resets"] == 2 and s["timeouts"] == 1 and s["status_5xx"] == 0
    assert fuzz.no_answer_kind(httpx.ConnectError("refused")) == "transport"
    stalled = fuzz.Case("POST", "/specopd/score_trees", {}, b"{", {"route": "score_trees", "expect": 408})
    assert fuzz.check_reply(stalled, 408, b'{"error": {"code": 408, "message": "no request body bytes"}}',
                            "application/json") == []
    assert fuzz.check_reply(stalled, 400, b'{"error": {"code": 400, "message": "x"}}', "application/json")


def test_check_reply_flags_what_the_property_forbids() -> None:
    case = fuzz.Case("POST", "/specopd/drafter/swap", {}, b"", {"route": "swap"})
    assert fuzz.check_reply(case, 400, b'{"error": {"code": 400, "message": "refused: x"}}', "application/json") == []
    assert fuzz.check_reply(case, 500, b'{"error": {"code": 500, "message": "TypeError"}}', "application/json")
    assert fuzz.check_reply(case, 400, b'{"error": {"code": 400, "message": ""}}', "application/json")
    assert fuzz.check_reply(case, 400, b"<html>", "text/html")
    unauthorised = fuzz.Case("POST", "/specopd/drafter/swap", {}, b"", {"route": "swap", "unauthorised": True})
    assert fuzz.check_reply(unauthorised, 401, b'{"error": "Unauthorized"}', "application/json") == []
    assert fuzz.check_reply(unauthorised, 400, b'{"error": {"message": "x"}}', "application/json")
    openai = b'{"object": "error", "message": "1 validation error"}'
    assert fuzz.check_reply(case, 400, openai, "application/json") == []


@pytest.mark.server
def test_fuzz_every_route(fuzz_target) -> None:
    srv, target = fuzz_target
    total = int(os.environ.get(fuzz.EXAMPLES_ENV, fuzz.DEFAULT_EXAMPLES))
    result = fuzz.run_all(target, total, strict=True)
    assert result["status_5xx"] == 0 and result["violations"] == 0, result["first_violations"]
    assert result["connection_resets"] == 0 and result["timeouts"] == 0, result
    assert result["healthy_after"] and result["probe_identical"], result
    statuses = result["statuses"]
    assert set(statuses) == set(fuzz.STRATEGIES)
    assert set(statuses["swap_no_key"]) == {"401"}, "no admin key: refused by SGLang's auth, whatever the body"
    assert "400" in statuses["swap"] and "400" in statuses["score_trees_json"], statuses
    assert "200" in statuses["score_trees_json"] and "200" in statuses["score_trees_binary"], statuses
    assert "200" in statuses["generate"], statuses
    assert {"200", "401"} <= set(statuses["prefix_cache"]), statuses
    # the admin routes' valid examples were undone: no transaction left staged, the start-up policy serving
    from _servers import drafter_info

    assert not drafter_info(srv.url, srv.spec.admin_api_key).get("staged")
    assert fuzz.start_up_policy(srv.url) == srv.extra["initial_policy"]


@pytest.mark.server
def test_every_crafted_kind_is_answered(fuzz_target) -> None:
    """A few examples of each crafted kind (strict): the answers each kind must get."""
    srv, target = fuzz_target
    tally = fuzz.Tally()
    fuzz.fuzz_kinds(target, 4, tally, strict=True)
    s = tally.summary()
    assert s["connection_resets"] == 0 and s["timeouts"] == 0 and s["status_5xx"] == 0, s
    by_kind = s["statuses_by_kind"]
    for kind in ("deep_nesting", "nan_infinity", "duplicate_keys"):
        assert set(by_kind[kind]) == {"400"}, (kind, by_kind[kind])
    for kind in ("huge_ints", "negative_ints"):  # a parent of -1 is valid (a child of the anchor)
        assert "400" in by_kind[kind] and set(by_kind[kind]) <= {"200", "400"}, (kind, by_kind[kind])
    assert set(by_kind["stalled_body"]) == {"408"} and set(by_kind["slow_body"]) <= {"200", "400"}
    assert set(by_kind["early_close"]) <= {"401", "413"} and sum(s["examples"].values()) >= 30
