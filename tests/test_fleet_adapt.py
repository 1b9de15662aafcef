"""``specopd adapt`` against a fleet, over fake workers: every worker's spool read with its own cursor (items merged,
each naming its worker, features from the spool that holds them), the cursors resumed exactly, a worker down during
a read keeps its cursor, Draft-OPD's traffic reads every spool, and a push is one FleetRollout transaction (commit
on all, abort on all, a missed commit reconciled)."""

from __future__ import annotations

import pytest

from fakes.adapt import FakeSpool
from fakes.adapt import run_ids as _run_ids
from fakes.fleet import FakeWorker
from specopd_trainer.adapt.slices import held_out
from specopd_trainer.client.http import ServerUnavailableError

W0, W1 = "http://w0", "http://w1"


class SpoolWorker(FakeSpool):
    """A fake worker client over its own spool (spool id = its name); ``down`` fails every call as a worker that
    dropped out does."""

    def __init__(self, spool_id):
        super().__init__(spool_id=spool_id)
        self.down = False

    def traffic_page(self, after, spool_id, max_items):
        if self.down:
            raise ServerUnavailableError("GET /specopd/traffic failed after 2 attempts: connection refused")
        return super().traffic_page(after, spool_id, max_items)

    def close(self):
        pass


def traffic_fleet(n0=24, n1=24):
    from specopd_trainer.fleet.client import FleetClient

    spools = {W0: SpoolWorker("spool-a"), W1: SpoolWorker("spool-b")}
    for url, n in ((W0, n0), (W1, n1)):
        for seq in range(1, n + 1):
            spools[url].add(seq, _run_ids(seq + (0 if url == W0 else 1000), 40), 8)
    return FleetClient([W0, W1], client_factory=lambda url: spools[url]), spools


def adapter(client, run_dir, **overrides):
    from _sft_fixture import tiny_drafter
    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.adapt.loop import Adapter

    cfg = AdaptConfig(**{"min_holdout": 100, "holdout_every": 4, "min_train_tokens": 64, "lr": 1e-2,
                         "warmup_steps": 2, "poll_s": 0.01, "ckpt_every": 5, "max_steps": 12, "retain": 0.0,
                         "algorithm_options": {"seqs_per_step": 4, "anchors_per_seq": 8}, **overrides})
    return Adapter(client, tiny_drafter(seed=0), run_dir, cfg, push=lambda d, v: None,
                   serving_version=lambda: "initial", progress=False, sleep=lambda s: None)


def test_every_workers_spool_is_read_with_its_own_cursor_and_resumed_exactly(tmp_path):
    client, spools = traffic_fleet()
    first = adapter(client, tmp_path / "run", read_items=8)
    out1 = first.run()
    st = first.state
    assert {u: (c.spool_id, c.after) for u, c in st.cursors.items()} == {W0: ("spool-a", 24), W1: ("spool-b", 24)}
    assert st.reader.by_worker == {W0: 24, W1: 24} and st.reader.items == 48
    assert st.reader.held_out == sum(held_out(_run_ids(s + o, 40)[:8], 4) for o in (0, 1000) for s in range(1, 25))
    seqs = first.train_buf.sequences + first.hold_buf.sequences
    assert {s.worker for s in seqs if s.id.startswith("spool-a:")} == {W0}
    assert {s.worker for s in seqs if s.id.startswith("spool-b:")} == {W1}
    assert len({s.id for s in seqs}) == 48 and out1["features"]["served"] == 48  # features from each spool
    assert spools[W0].feature_calls > 0 and spools[W1].feature_calls > 0 and spools[W0].score_calls == 0
    assert st.cursor.spool_id is None  # the one-server cursor is not used
    for seq in range(25, 33):  # new traffic on w1 only
        spools[W1].add(seq, _run_ids(seq + 1000, 40), 8)
    second = adapter(client, tmp_path / "run", read_items=8, max_steps=20)
    assert second.state.step == 12 and {u: c.after for u, c in second.state.cursors.items()} == {W0: 24, W1: 24}
    out2 = second.run()
    assert out2["step"] == 20 and out2["reader"]["by_worker"] == {W0: 24, W1: 32} and out2["reader"]["items"] == 56
    assert second.train_buf.counts["duplicates"] == 0 and second.hold_buf.counts["duplicates"] == 0
    assert len(second.train_buf) + len(second.hold_buf) == 56


def test_a_worker_down_during_a_read_keeps_its_cursor_and_is_read_when_back():
    from specopd_trainer.adapt.fleet_reader import FleetTrafficReader
    from specopd_trainer.adapt.reader import Cursor, ReaderCounts

    client, spools = traffic_fleet(n0=6, n1=6)
    cursors = {W1: Cursor("spool-b", 2)}  # w1 resumes at its seq 2; w0 is new
    counts = ReaderCounts()
    reader = FleetTrafficReader(client, cursors, counts, holdout_every=4, vocab_size=97, max_items=64)
    spools[W1].down = True
    got = reader.read()
    assert [(it.worker, it.seq) for it in got] == [(W0, s) for s in range(1, 7)]
    assert counts.unavailable == 1 and cursors[W1].after == 2 and cursors[W0].after == 6
    spools[W1].down = False
    got = reader.read()
    assert [(it.worker, it.seq) for it in got] == [(W1, s) for s in range(3, 7)]
    assert counts.by_worker == {W0: 6, W1: 4} and [it.held_out for it in got] == [
        held_out(_run_ids(s + 1000, 40)[:8], 4) for s in range(3, 7)]
    assert client.traffic_features([3], "spool-b")[0].keys() == {3}  # the spool read from w1 is w1's
    with pytest.raises(Exception, match="409"):
        client.traffic_features([3], "spool-z")


def test_a_new_fleet_run_can_start_at_every_workers_newest_item(tmp_path):
    client, spools = traffic_fleet(n0=5, n1=7)
    ad = adapter(client, tmp_path / "run", start_at="newest")
    assert {u: c.after for u, c in ad.state.cursors.items()} == {W0: 5, W1: 7} and ad.reader.read() == []


def test_draft_opd_traffic_reads_every_worker_and_purges_all():
    client, spools = traffic_fleet(n0=3, n1=2)
    spools[W0].version = "v1"

    class Cursoring:  # SpecOPDClient.traffic keeps its own cursor per worker
        def __init__(self, sp):
            self.sp, self.after, self.last_traffic = sp, 0, None

        def traffic(self, max_items):
            page = self.sp.traffic_page(self.after, None, max_items)
            self.after = page["next_after"]
            from types import SimpleNamespace

            self.last_traffic = SimpleNamespace(missed=1, next_after=self.after,
                                                stats=SimpleNamespace(newest_seq=page["stats"]["newest_seq"]))
            return page["items"]

        def purge_traffic(self):
            n = len(self.sp.items)
            self.sp.items = []
            return n

    from specopd_trainer.fleet.client import FleetClient

    wrapped = {u: Cursoring(sp) for u, sp in spools.items()}
    fc = FleetClient([W0, W1], client_factory=lambda url: wrapped[url])
    items = fc.traffic(2)
    assert [(it["worker"], it["seq"]) for it in items] == [(W0, 1), (W0, 2), (W1, 1), (W1, 2)]
    assert fc.last_traffic.missed == 2 and fc.last_traffic.stats.newest_seq == 1  # w0 holds one more
    assert fc.purge_traffic() == 5


@pytest.fixture()
def pusher():
    from specopd_trainer.fleet.push import FleetPusher
    from specopd_trainer.fleet.rollout import FleetRollout

    workers = {}
    ro = FleetRollout([W0, W1], admin_api_key="k", worker_factory=lambda url: FakeWorker(url, workers))
    warnings = []
    return FleetPusher([W0, W1], admin_api_key="k", rollout=ro, say=warnings.append), workers, warnings


def test_a_push_is_one_transaction_committed_on_every_worker(pusher):
    from _sft_fixture import tiny_drafter

    push, w, _ = pusher
    report = push(tiny_drafter(seed=1), "adapt-run-1")
    assert report.ok and [w[u].version for u in (W0, W1)] == ["adapt-run-1"] * 2
    assert [c[0] for c in w[W0].calls] == [c[0] for c in w[W1].calls] == ["stage", "commit"]
    assert {c[1] for c in w[W0].calls + w[W1].calls} == {report.txn}  # one transaction
    assert [o.serving for o in report.workers] == ["adapt-run-1"] * 2  # verified by GET /specopd/drafter


def test_a_refused_push_aborts_on_every_worker_and_changes_nothing(pusher):
    from specopd_trainer.fleet.push import FleetPushError
    from specopd_trainer.fleet.worker import DrafterUpdate

    push, w, _ = pusher
    w[W1].refuse = "refused: the drafter's block_size differs"
    with pytest.raises(FleetPushError, match="aborted on every worker .* http://w1: refused: the drafter's") as err:
        push.push_update(DrafterUpdate("v2", b"\x02"))
    assert err.value.status == 400 and not err.value.report.committed
    assert [w[u].version for u in (W0, W1)] == ["initial"] * 2 and all(w[u].staged is None for u in (W0, W1))
    assert ("abort", err.value.report.txn) in w[W0].calls and ("abort", err.value.report.txn) in w[W1].calls


def test_a_worker_that_missed_the_commit_is_reconciled_at_once(pusher):
    from specopd_trainer.fleet.worker import DrafterUpdate

    push, w, warnings = pusher
    w[W1].down_at_commit = True
    report = push.push_update(DrafterUpdate("v3", b"\x03"))
    assert report.committed and report.missed == (W1,)
    assert w[W1].version == "initial" and push.missed == [W1] and "do(es) not serve it yet" in warnings[0]
    w[W1].down_at_commit = False
    push.push_update(DrafterUpdate("v4", b"\x04"))  # the laggard is reconciled first, then the new push
    assert [w[u].version for u in (W0, W1)] == ["v4", "v4"] and push.missed == []


def test_adapt_state_round_trips_the_per_worker_cursors():
    from specopd_trainer.adapt.reader import Cursor
    from specopd_trainer.adapt.state import AdaptState

    st = AdaptState(cursors={W0: Cursor("spool-a", 7), W1: Cursor(None, 0)})
    st.reader.by_worker[W0] = 7
    back = AdaptState.from_dict(st.as_dict())
    assert back.cursors == st.cursors and back.reader.by_worker == {W0: 7}
    old = st.as_dict()
    old.pop("cursors")
    old["reader"].pop("by_worker")
    old["reader"].pop("unavailable")
    assert AdaptState.from_dict(old).cursors == {}  # a checkpoint written before fleets resumes
