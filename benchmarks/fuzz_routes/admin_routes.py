"""Hypothesis strategies of the route fuzz for the plugin's admin routes beyond swap (issue 54): the two-phase
rollout (``POST /specopd/drafter/stage?txn=&ttl_s=``, ``/commit``, ``/abort``), the speculative policy (``GET`` /
``POST /specopd/policy``) and the live-traffic spool (``GET /specopd/traffic?after=&max_items=``,
``GET /specopd/traffic/features?seqs=``, ``POST /specopd/traffic/purge``). Each draws near-valid and hostile
requests (bad transaction ids, NaN / huge TTLs and cursors, wrong types, junk bodies) with the admin key, a wrong
one or none (``unauthorised``: 401 expected). The runner (:mod:`fuzz_routes.run`) cleans up after these routes (a
staged transaction aborted, the start-up policy restored), so a shared server ends as it was.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from fuzz_routes.strategies import HUGE, Case, Target, _maybe, admin, auth_headers, json_scalar, json_value, swap_bodies
from sglang_specopd.wire.policy import POLICY_PATH
from sglang_specopd.wire.rollout import ABORT_DRAFTER_PATH, COMMIT_DRAFTER_PATH, STAGE_DRAFTER_PATH
from sglang_specopd.wire.traffic import TRAFFIC_FEATURES_PATH, TRAFFIC_PATH, TRAFFIC_PURGE_PATH

TXN_IDS = ["fz1", "fz2", "a.b:c-1", "", "x" * 65, "bad id", "../x", "t\x00", "é"]
NUMBERS = st.one_of(st.integers(-3, 5000), st.sampled_from(HUGE + ["nan", "inf", "-inf", "1e400", "", "x", "0x10"]))
key_or_not = st.one_of(st.just(admin), st.just(admin), auth_headers)


def _query(params: dict) -> str:
    from urllib.parse import urlencode

    return ("?" + urlencode(params)) if params else ""


def _case(method: str, path: str, headers: dict, body: bytes, route: str) -> Case:
    return Case(method, path, headers, body, {"route": route, "unauthorised": headers != admin})


def rollout(t: Target):
    """Stage (a swap body under a drawn txn id and TTL), commit and abort (JSON ``{"txn": ...}`` or junk)."""
    txn = st.one_of(st.sampled_from(TXN_IDS), st.text(max_size=8))
    stage_query = st.fixed_dictionaries({}, optional={"txn": txn, "ttl_s": NUMBERS, "junk": st.text(max_size=4)})
    stage = st.builds(lambda q, b, h: _case("POST", STAGE_DRAFTER_PATH + _query(q), h, b, "rollout"),
                      stage_query, swap_bodies(t), key_or_not)
    txn_body = st.one_of(st.fixed_dictionaries({"txn": _maybe(txn)}, optional={"junk": json_scalar}).map(json.dumps),
                         json_value.map(json.dumps), st.text(max_size=20))
    end = st.builds(lambda p, b, h: _case("POST", p, h, b.encode(), "rollout"),
                    st.sampled_from([COMMIT_DRAFTER_PATH, ABORT_DRAFTER_PATH]), txn_body, key_or_not)
    return st.one_of(stage, end, end)


def policy(t: Target):
    """``GET`` (public) and ``POST`` (admin) of the policy: near-valid settings with wrong values mixed in."""
    curve = st.dictionaries(st.one_of(st.integers(-1, 9), st.text(max_size=2)),
                            _maybe(st.lists(_maybe(st.floats(allow_nan=True, allow_infinity=True)), max_size=5)),
                            max_size=2)
    settings = st.fixed_dictionaries(
        {"policy": _maybe(st.sampled_from(["fixed", "goodput", "always", ""]))},
        optional={"cost_curve_ms": _maybe(curve), "explore_every": _maybe(NUMBERS),
                  "calibration_steps": _maybe(NUMBERS), "prior_accept": _maybe(st.floats(-1, 2)),
                  "plain_k0": _maybe(st.booleans()), "junk": json_scalar})
    body = st.one_of(settings.map(json.dumps), json_value.map(json.dumps), st.just(""), st.text(max_size=20))
    get = st.builds(lambda q: Case("GET", POLICY_PATH + q, {}, b"", {"route": "policy"}),
                    st.sampled_from(["", "?x=1", "?policy=goodput"]))
    post = st.builds(lambda b, h: _case("POST", POLICY_PATH, h, b.encode(), "policy"), body, key_or_not)
    return st.one_of(get, post, post)


def traffic(t: Target):
    """Reads with drawn cursors / sizes / sequence lists and purges, with and without the key."""
    read_q = st.fixed_dictionaries({}, optional={"after": NUMBERS, "max_items": NUMBERS, "junk": st.text(max_size=4)})
    seqs = st.one_of(st.lists(NUMBERS, max_size=5).map(lambda xs: ",".join(map(str, xs))), st.text(max_size=12))
    read = st.builds(lambda q, h: _case("GET", TRAFFIC_PATH + _query(q), h, b"", "traffic"), read_q, key_or_not)
    features = st.builds(lambda s, h: _case("GET", TRAFFIC_FEATURES_PATH + _query({"seqs": s}), h, b"", "traffic"),
                         seqs, key_or_not)
    purge = st.builds(lambda b, h: _case("POST", TRAFFIC_PURGE_PATH, h, b, "traffic"), st.binary(max_size=20),
                      key_or_not)
    return st.one_of(read, read, features, purge)


ADMIN_STRATEGIES = {"rollout": rollout, "policy": policy, "traffic": traffic}
