"""``specopd train`` pushing into a fleet with a worker down (fake workers, no servers): a push aborted only because a
worker could not be reached is deferred (every worker keeps its drafter, training goes on), the next push commits
on every worker, a deferred last push is retried until the worker is back, and a refusal still ends the run."""

from __future__ import annotations

import pytest

from fakes.fleet import FakeWorker

W0, W1 = "http://w0", "http://w1"


class FakeDrafter:
    """What FleetPusher reads of a trainer drafter."""

    def __init__(self, tag: int):
        self.tag = tag

    def checkpoint_config(self):
        return {"architectures": ["DFlashDraftModel"], "tag": self.tag}

    def checkpoint_tensors(self):
        import torch

        return {"w": torch.full((2,), float(self.tag))}


@pytest.fixture()
def session():
    """A FleetSession over two fake workers (its HTTP start-up skipped), its warnings and the workers."""
    from sglang_specopd.app.train.fleet_session import FleetSession
    from specopd_trainer.fleet.push import FleetPusher
    from specopd_trainer.fleet.rollout import FleetRollout

    workers, said = {}, []
    ro = FleetRollout([W0, W1], admin_api_key="k", worker_factory=lambda url: FakeWorker(url, workers))
    sess = FleetSession.__new__(FleetSession)
    sess._pusher = FleetPusher([W0, W1], admin_api_key="k", rollout=ro, say=said.append)
    sess.say, sess.deferred, sess.push_enabled = said.append, None, True
    return sess, workers, said


def test_unreachable_is_true_for_a_worker_down_and_false_for_a_refusal(session):
    from specopd_trainer.fleet.push import FleetPushError
    from specopd_trainer.fleet.worker import DrafterUpdate

    sess, w, _ = session
    w[W1].down = True
    with pytest.raises(FleetPushError) as down:
        sess._pusher.push_update(DrafterUpdate("v1", b"\x01"))
    assert down.value.unreachable and down.value.status == 503
    w[W1].down, w[W1].refuse = False, "refused: block_size differs"
    with pytest.raises(FleetPushError) as refused:
        sess._pusher.push_update(DrafterUpdate("v2", b"\x02"))
    assert not refused.value.unreachable and refused.value.status == 400
    assert [w[u].version for u in (W0, W1)] == ["initial", "initial"]


def test_a_push_with_a_worker_down_is_deferred_and_the_next_one_commits_everywhere(session):
    sess, w, said = session
    versions = []
    push = sess.pusher("specopd-run", versions)
    w[W1].down = True
    push(4, FakeDrafter(4))  # no exception: training goes on
    assert versions == [] and sess.deferred == "specopd-run-step4"
    assert [w[u].version for u in (W0, W1)] == ["initial", "initial"] and w[W0].staged is None  # aborted on W0
    assert "push of specopd-run-step4 deferred, a worker is down" in said[-1]
    w[W1].down = False
    push(8, FakeDrafter(8))
    assert versions == ["specopd-run-step8"] and sess.deferred is None
    assert [w[u].version for u in (W0, W1)] == ["specopd-run-step8"] * 2
    sess.finish_pushes(FakeDrafter(8), versions, sleep=pytest.fail)  # nothing deferred: no retry, no sleep


def test_a_deferred_last_push_is_retried_until_the_worker_is_back(session):
    sess, w, said = session
    versions = []
    push = sess.pusher("specopd-run", versions)
    w[W1].down = True
    push(16, FakeDrafter(16))
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        w[W1].down = len(sleeps) < 3  # back before the third try

    sess.finish_pushes(FakeDrafter(16), versions, retry_s=100.0, gap_s=5.0, sleep=sleep, clock=lambda: 0.0)
    assert sleeps == [5.0, 5.0, 5.0] and versions == ["specopd-run-step16"] and sess.deferred is None
    assert [w[u].version for u in (W0, W1)] == ["specopd-run-step16"] * 2


def test_the_retry_gives_up_after_its_budget_and_a_refusal_ends_the_run(session):
    from sglang_specopd.app.train.options import _TrainFail

    sess, w, _ = session
    versions = []
    push = sess.pusher("specopd-run", versions)
    w[W1].down = True
    push(16, FakeDrafter(16))
    t = iter(range(0, 1000, 10))
    with pytest.raises(_TrainFail, match=r"did not reach every worker within 30 s .* rerun the same command"):
        sess.finish_pushes(FakeDrafter(16), versions, retry_s=30.0, gap_s=10.0, sleep=lambda s: None,
                           clock=lambda: float(next(t)))
    assert versions == [] and [w[u].version for u in (W0, W1)] == ["initial", "initial"]
    w[W1].down, w[W1].refuse = False, "refused: the drafter's block_size differs"
    with pytest.raises(_TrainFail, match="push refused: every worker kept its drafter"):
        push(20, FakeDrafter(20))


def test_a_stage_answered_with_5xx_is_a_refusal_not_a_worker_down(session):
    from sglang_specopd.app.train.options import _TrainFail
    from specopd_trainer.fleet.worker import Step

    sess, w, _ = session
    versions = []
    push = sess.pusher("specopd-run", versions)
    w[W1].stage = lambda txn, update, ttl_s: Step(False, error="HTTP 503: the drafter does not fit", status=503)
    with pytest.raises(_TrainFail, match="push refused: every worker kept its drafter .* does not fit"):
        push(4, FakeDrafter(4))
    assert sess.deferred is None and [w[u].version for u in (W0, W1)] == ["initial", "initial"]


def test_a_worker_call_keeps_the_http_status_of_its_failure():
    from specopd_trainer.client.http import ServerRequestError, ServerUnavailableError
    from specopd_trainer.fleet.worker import _step

    def raising(exc):
        def call():
            raise exc
        return call

    assert _step(lambda: {"ok": 1}).reply == {"ok": 1}
    assert _step(raising(ServerUnavailableError("connection refused"))).status is None
    assert _step(raising(ServerUnavailableError("HTTP 503: full", 503))).status == 503
    assert _step(raising(ServerRequestError(409, "conflict"))).status == 409
    bad = _step(raising(ValueError("1 validation error for StageReply")))
    assert not bad.ok and bad.status == 502 and bad.error.startswith("malformed reply: 1 validation error")
