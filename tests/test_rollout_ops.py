"""The rollout's scheduler ops (:mod:`sglang_specopd.server.drafter.rollout`) through the control channel's dispatcher
(:func:`sglang_specopd.server.control.handle_control`: status codes as the HTTP side sees them), on a fake
scheduler: the swap's validation and install are stand-ins that record what they were given (the real ones run in
tests/test_fleet_rollout_server.py). Imports SGLang (the control channel's IPC types): ``slow``."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture
def ops(monkeypatch):
    """``call(op, payload) -> (status, message, reply dict | None)`` and the list of installs done."""
    from sglang_specopd.server import control
    from sglang_specopd.server.drafter import txn as drafter_txn
    from sglang_specopd.server.drafter import swap as hot_swap
    from sglang_specopd.server.drafter import rollout  # noqa: F401  (registers the ops)

    drafter_txn.reset()
    installs = []
    worker = SimpleNamespace(draft_model=torch.nn.Linear(2, 2))
    from sglang_specopd.server import target_identity

    # the fake scheduler has no server_args: GET /specopd/drafter's target field comes from a stand-in
    monkeypatch.setattr(target_identity, "target_identity", lambda scheduler: {"fingerprint": "sha256:0", "dtype": "x"})
    monkeypatch.setitem(hot_swap._STATE, "version", "initial")
    monkeypatch.setitem(hot_swap._STATE, "swaps", 0)

    def checked_drafter(scheduler, body: bytes):
        req = json.loads(body)
        if req.get("bad"):
            raise ValueError("refused: w has shape (3,), expected (2,)")
        return worker, {"w": torch.full((2,), float(req["value"]))}, req["version"]

    def install(scheduler, w, tensors, version):
        assert w is worker
        installs.append((version, {n: t.clone() for n, t in tensors.items()}))
        previous = hot_swap._STATE["version"]
        hot_swap._STATE.update(version=version, swaps=hot_swap._STATE["swaps"] + 1)
        return {"version": version, "previous_version": previous, "swaps": hot_swap._STATE["swaps"],
                "cache_flushed": True}

    monkeypatch.setattr(hot_swap, "checked_drafter", checked_drafter)
    monkeypatch.setattr(hot_swap, "serving_worker", lambda scheduler: worker)
    monkeypatch.setattr(hot_swap, "install", install)

    def call(op, payload: bytes):
        out = control.handle_control(SimpleNamespace(), control.SpecOPDControlReq(op=op, payload=payload))
        return out.status, out.message, (json.loads(out.payload) if out.payload else None)

    yield call, installs
    drafter_txn.reset()


def stage_payload(txn: str, version: str, value: float = 1.0, ttl: float = 30.0, bad: bool = False) -> bytes:
    from sglang_specopd.wire.rollout import StageParams, stage_op_payload

    body = json.dumps({"version": version, "value": value, "bad": bad}).encode()
    return stage_op_payload(StageParams(txn, ttl), body)


def txn_body(txn: str) -> bytes:
    return json.dumps({"txn": txn}).encode()


def test_stage_then_commit(ops) -> None:
    call, installs = ops
    status, _, reply = call("stage_drafter", stage_payload("t1", "v1", value=3.0))
    assert status == 200 and reply["version"] == "v1" and reply["serving_version"] == "initial"
    assert reply["replaced"] is False and reply["ttl_s"] == 30.0
    assert installs == []  # staged, not serving
    status, _, info = call("drafter_info", b"")
    assert info["version"] == "initial" and info["staged"]["txn"] == "t1" and info["staged"]["version"] == "v1"
    status, _, reply = call("commit_drafter", txn_body("t1"))
    assert status == 200 and reply == {"txn": "t1", "version": "v1", "previous_version": "initial", "swaps": 1,
                                       "cache_flushed": True, "already_committed": False}
    assert [v for v, _ in installs] == ["v1"] and torch.equal(installs[0][1]["w"], torch.full((2,), 3.0))
    status, _, again = call("commit_drafter", txn_body("t1"))  # a retried commit: same reply, nothing done
    assert status == 200 and again["already_committed"] is True and again["version"] == "v1" and len(installs) == 1
    assert call("drafter_info", b"")[2]["staged"] is None


def test_conflicts_are_409(ops) -> None:
    call, installs = ops
    assert call("stage_drafter", stage_payload("t1", "v1"))[0] == 200
    status, message, _ = call("stage_drafter", stage_payload("t2", "v2"))
    assert status == 409 and "transaction 't1' (version 'v1') is staged" in message and "'t2' cannot" in message
    status, message, _ = call("swap_drafter", json.dumps({"version": "v3", "value": 1.0}).encode())
    assert status == 409 and "a one-phase swap cannot proceed" in message
    status, message, _ = call("commit_drafter", txn_body("t2"))
    assert status == 409 and "'t2' is not staged" in message and "'t1' is staged instead" in message
    assert installs == []
    assert call("stage_drafter", stage_payload("t1", "v1b", value=2.0))[2]["replaced"] is True  # own retry
    assert call("commit_drafter", txn_body("t1"))[2]["version"] == "v1b"


def test_abort_and_refused_stage_change_nothing(ops) -> None:
    call, installs = ops
    status, message, _ = call("stage_drafter", stage_payload("t1", "v1", bad=True))
    assert status == 400 and "has shape (3,)" in message
    assert call("drafter_info", b"")[2]["staged"] is None
    assert call("stage_drafter", stage_payload("t1", "v1"))[0] == 200
    status, _, reply = call("abort_drafter", txn_body("other"))  # never drops another transaction's copy
    assert status == 200 and reply["aborted"] is False and reply["staged"]["txn"] == "t1"
    status, _, reply = call("abort_drafter", txn_body("t1"))
    assert status == 200 and reply == {"txn": "t1", "aborted": True, "version": "initial", "staged": None}
    status, message, _ = call("commit_drafter", txn_body("t1"))
    assert status == 409 and "it was aborted" in message
    assert installs == [] and call("drafter_info", b"")[2]["version"] == "initial"


def test_expiry(ops) -> None:
    call, installs = ops
    assert call("stage_drafter", stage_payload("t1", "v1", ttl=0.2))[0] == 200
    status, _, reply = call("expire_drafter", txn_body("t1"))
    assert status == 200 and 0 < reply["expires_in_s"] <= 0.2  # not due yet: the HTTP timer waits again
    time.sleep(0.25)
    assert call("expire_drafter", txn_body("t1"))[2] == {"txn": "t1", "expires_in_s": None}
    status, message, _ = call("commit_drafter", txn_body("t1"))
    assert status == 409 and "it was expired" in message and installs == []
    assert call("stage_drafter", stage_payload("t2", "v2"))[0] == 200  # nothing blocks a new transaction
