"""FleetRollout (:mod:`specopd_trainer.fleet.rollout`) over fake workers that keep a worker's transaction state
(serving version, one staged transaction, the last commit) and can refuse, conflict or be down. The HTTP calls
themselves run against two real servers in tests/test_fleet_rollout_server.py."""

from __future__ import annotations

from typing import Dict

import pytest

from specopd_trainer.fleet.rollout import FleetRollout
from specopd_trainer.fleet.worker import DrafterUpdate

from fakes.fleet import FakeWorker

URLS = ("http://w0", "http://w1", "http://w2")


def fleet(urls=URLS, **kw):
    workers: Dict[str, FakeWorker] = {}
    ro = FleetRollout(list(urls), admin_api_key="k", worker_factory=lambda url: FakeWorker(url, workers), **kw)
    return ro, workers


V1 = DrafterUpdate("v1", b"\x01")
V2 = DrafterUpdate("v2", b"\x02")


def test_every_worker_commits() -> None:
    ro, w = fleet()
    report = ro.rollout(V1)
    assert report.committed and report.ok and report.missed == () and report.refused == ()
    assert [o.serving for o in report.workers] == ["v1"] * 3
    assert all(x.version == "v1" and x.staged is None for x in w.values())
    assert [c[0] for c in w["http://w0"].calls] == ["stage", "commit"]
    assert len({c[1] for x in w.values() for c in x.calls}) == 1  # one transaction id everywhere
    assert ro.committed_version == "v1"


def test_one_refused_stage_aborts_everywhere() -> None:
    ro, w = fleet()
    w["http://w1"].refuse = "refused: the new drafter differs from the serving one in block_size"
    report = ro.rollout(V1)
    assert not report.committed and not report.ok and report.missed == ()
    assert report.refused == (("http://w1", "refused: the new drafter differs from the serving one in block_size"),)
    assert all(x.version == "initial" and x.staged is None for x in w.values())
    assert all([c[0] for c in x.calls] == ["stage", "abort"] for x in w.values())
    assert [o.serving for o in report.workers] == ["initial"] * 3 and ro.committed_version is None


def test_another_transaction_staged_is_a_conflict_and_is_kept() -> None:
    ro, w = fleet()
    w["http://w2"].staged = ("other-trainer", "vX")
    report = ro.rollout(V1)
    assert not report.committed and report.workers[2].stage.status == 409
    assert "'other-trainer' is staged" in report.refused[0][1]
    assert w["http://w2"].staged == ("other-trainer", "vX")  # our abort never drops their copy
    assert all(x.version == "initial" for x in w.values())


def test_worker_down_at_commit_is_reported_then_reconciled() -> None:
    ro, w = fleet()
    w["http://w1"].down_at_commit = True
    report = ro.rollout(V1)
    assert report.committed and not report.ok and report.missed == ("http://w1",)
    assert report.workers[1].commit.ok is False and report.workers[1].serving == "initial"
    assert w["http://w1"].staged == (report.txn, "v1")
    w["http://w1"].down_at_commit = False
    out = ro.reconcile()
    assert [o.serving for o in out] == ["v1"] * 3 and all(o.verify.ok for o in out)
    assert out[1].stage is None and out[1].commit.reply["txn"] == report.txn  # its staged copy was committed
    assert out[0].commit is None and out[0].stage is None  # already serving: only verified


def test_restarted_or_new_worker_is_staged_and_committed_anew() -> None:
    ro, w = fleet(urls=URLS[:2])
    ro.rollout(V1)
    w["http://w1"].version = "initial"  # restarted: start-up drafter, nothing staged
    out = ro.reconcile(["http://w1", "http://w9"], "v1")
    assert [o.serving for o in out] == ["v1", "v1"] and all(o.stage.ok and o.commit.ok for o in out)
    assert "http://w9" in ro.workers and ro.rollout(V2).ok and w["http://w9"].version == "v2"
    with pytest.raises(ValueError, match="no committed update of version 'v0'"):
        ro.reconcile(version="v0")


def test_reconcile_reports_a_worker_still_down() -> None:
    ro, w = fleet()
    ro.rollout(V1)
    w["http://w0"].version, w["http://w0"].down = "initial", True
    out = ro.reconcile(["http://w0"])
    assert out[0].verify.ok is False and out[0].stage.ok is False and "connection refused" in out[0].error


def test_rollback_is_the_same_transaction_with_the_previous_weights() -> None:
    ro, w = fleet(initial=DrafterUpdate("initial", b"\x00"))
    assert ro.rollout(V1).ok and ro.rollout(V2).ok
    back = ro.rollback()
    assert back.ok and back.version == "v1" and all(x.version == "v1" for x in w.values())
    assert ro.rollback().version == "v2"  # the one committed before v1's re-commit
    ro2, _ = fleet()
    with pytest.raises(ValueError, match="nothing to roll back to"):
        ro2.rollback()


def test_probe_must_show_only_the_new_version() -> None:
    ro, w = fleet(probe_input_ids=[1, 2, 3])
    w["http://w2"].probe_seen = ["initial", "v1"]
    report = ro.rollout(V1)
    assert report.committed and report.missed == ("http://w2",)
    assert "drafted by ['initial', 'v1'], not only 'v1'" in report.workers[2].error
    with pytest.raises(ValueError, match="probe_tokens must be >= 2"):
        FleetRollout(["http://a"], admin_api_key="k", probe_input_ids=[1], probe_tokens=1)


def test_the_lowest_url_is_the_lock_of_concurrent_rollouts() -> None:
    ro, w = fleet(urls=("http://w2", "http://w0", "http://w1"))
    w["http://w0"].staged = ("trainer-a", "vA")  # another trainer got the lock worker first
    report = ro.rollout(V1)
    assert not report.committed and report.refused == (("http://w0", "conflict: transaction 'trainer-a' is staged"),)
    assert [o.stage for o in report.workers if o.url != "http://w0"] == [None, None]  # staged nowhere else
    assert [c[0] for c in w["http://w1"].calls] == ["abort"] and w["http://w0"].staged == ("trainer-a", "vA")
    w["http://w0"].staged = None  # trainer A committed or aborted
    assert ro.rollout(V1).ok and [c[0] for c in w["http://w0"].calls][-2:] == ["stage", "commit"]
