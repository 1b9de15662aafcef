"""The two-phase swap's wire format (:mod:`sglang_specopd.wire.rollout`), the staged-transaction state
(:mod:`sglang_specopd.server.drafter.txn`) and the scheduler ops (:mod:`sglang_specopd.server.drafter.rollout`, with the
swap's validation and install replaced by stand-ins: the real ones run in tests/test_fleet_rollout_server.py)."""

from __future__ import annotations

import json

import pytest

from sglang_specopd.server.drafter import txn as drafter_txn
from sglang_specopd.server.drafter.txn import Staged, TxnConflict
from sglang_specopd.wire.rollout import (
    DEFAULT_STAGE_TTL_S,
    MAX_STAGE_TTL_S,
    STAGE_TTL_ENV,
    TXN_BODY_MAX_BYTES,
    StageParams,
    check_txn_id,
    default_ttl,
    parse_stage_query,
    parse_txn_body,
    split_stage_payload,
    stage_op_payload,
)

# --- wire ---


@pytest.mark.parametrize("txn", ["a", "rollout-0123abcd", "x" * 64, "A.b:c_d-9"])
def test_txn_ids_accepted(txn) -> None:
    assert check_txn_id(txn) == txn


@pytest.mark.parametrize("txn", ["", "x" * 65, "a b", "a/b", "é", 7, None, ["a"]])
def test_txn_ids_refused(txn) -> None:
    with pytest.raises(ValueError, match="txn must be 1..64 characters"):
        check_txn_id(txn)


def test_stage_query() -> None:
    assert parse_stage_query({"txn": "t1"}, 30.0) == StageParams("t1", 30.0)
    assert parse_stage_query({"txn": "t1", "ttl_s": "2.5"}, 30.0) == StageParams("t1", 2.5)


@pytest.mark.parametrize("query, reason", [
    ({}, "missing query parameter txn"),
    ({"txn": "t", "other": "1"}, r"unknown query parameter\(s\) \['other'\]"),
    ({"txn": "a b"}, "txn must be"),
    ({"txn": "t", "ttl_s": "soon"}, "ttl_s must be a number of seconds, got 'soon'"),
    ({"txn": "t", "ttl_s": "nan"}, "ttl_s must be in 0.1..3600 seconds"),
    ({"txn": "t", "ttl_s": "0"}, "ttl_s must be in"),
    ({"txn": "t", "ttl_s": str(MAX_STAGE_TTL_S + 1)}, "ttl_s must be in"),
])
def test_stage_query_refused(query, reason) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_stage_query(query, 30.0)


def test_default_ttl_from_environment() -> None:
    assert default_ttl({}) == DEFAULT_STAGE_TTL_S
    assert default_ttl({STAGE_TTL_ENV: " 12 "}) == 12.0
    with pytest.raises(ValueError, match=f"{STAGE_TTL_ENV} must be a number"):
        default_ttl({STAGE_TTL_ENV: "1m"})
    with pytest.raises(ValueError, match=f"{STAGE_TTL_ENV} must be in"):
        default_ttl({STAGE_TTL_ENV: "-1"})


def test_txn_body() -> None:
    assert parse_txn_body(b'{"txn": "t-1"}') == "t-1"


@pytest.mark.parametrize("body, reason", [
    (b"", "not JSON|Expecting value"),
    (b'{"txn": "a", "txn": "b"}', "duplicate key"),
    (b'{"txn": "a", "extra": 1}', "extra: Extra inputs are not permitted"),
    (b'{"txn": 5}', "txn: Input should be a valid string"),
    (b'{"txn": "a b"}', "txn must be 1..64"),
    (b'["a"]', "Input should be a valid dictionary"),
    (b'{"txn": [[["a"]]]}', "nested 4 levels deep; the limit is 2"),
    (b'{"txn": "' + b"a" * TXN_BODY_MAX_BYTES + b'"}', f"exceeds {TXN_BODY_MAX_BYTES} bytes"),
])
def test_txn_body_refused(body, reason) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_txn_body(body)


def test_stage_op_payload_round_trip() -> None:
    body = b"\x00\n{binary}\n"
    params, got = split_stage_payload(stage_op_payload(StageParams("t", 1.5), body))
    assert params == StageParams("t", 1.5) and got == body


# --- the staged-transaction state ---


@pytest.fixture
def txns():
    drafter_txn.reset()
    yield drafter_txn
    drafter_txn.reset()


def staged(txn: str, version: str = "v1", ttl: float = 10.0, now: float = None) -> Staged:
    import time

    now = time.monotonic() if now is None else now
    return Staged(txn, version, {"w": 1}, now, now + ttl, ttl)


def test_one_transaction_at_a_time(txns) -> None:
    assert txns.put(staged("a")) is False
    assert txns.put(staged("a", "v2")) is True  # a retried stage replaces its own copy
    assert txns.current().version == "v2"
    with pytest.raises(TxnConflict, match="transaction 'a' \\(version 'v2'\\) is staged .* transaction 'b' cannot"):
        txns.put(staged("b"))
    with pytest.raises(TxnConflict, match="a one-phase swap cannot proceed"):
        txns.check_free()
    with pytest.raises(TxnConflict, match="'b' is not staged on this worker: it was never staged here.*'a' is staged"):
        txns.take("b")
    assert txns.end("b", "aborted") is False and txns.current().txn == "a"  # never drops another's copy
    assert txns.take("a").version == "v2" and txns.current() is None
    txns.check_free()


def test_expiry_drops_the_staged_copy(txns) -> None:
    import time

    txns.put(staged("a", ttl=5.0))
    assert txns.current(now=time.monotonic() + 4.0).txn == "a"
    assert txns.current(now=time.monotonic() + 5.1) is None
    with pytest.raises(TxnConflict, match="'a' is not staged on this worker: it was expired"):
        txns.take("a")
    txns.put(staged("b"))  # the expired one no longer blocks anybody


def test_last_commit_and_info(txns) -> None:
    txns.put(staged("a", "v7", ttl=3.0))
    info = txns.current().info()
    assert info["txn"] == "a" and info["version"] == "v7" and 2.5 < info["expires_in_s"] <= 3.0
    txns.take("a")
    txns.record_commit("a", {"version": "v7"})
    assert txns.last_commit("a") == {"version": "v7"} and txns.last_commit("b") is None
    txns.clear_last_commit()
    assert txns.last_commit("a") is None
