"""``specopd adapt`` against a fake server: the spool reader (bad items counted and skipped, held-out by seq), the
byte-bounded persistent buffers, served features with prefix fills, the deploy guard (hand-checkable cases; a worse
candidate is never deployed), and the loop (learns, pushes, rolls back, resumes exactly after a stop)."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch

from _sft_fixture import tiny_drafter
from fakes.adapt import D, FakeSpool
from fakes.adapt import features as _features
from fakes.adapt import run_ids as _run_ids
from fakes.adapt import seq_ids as _seq_ids


# ---- reader ---------------------------------------------------------------------------------------------------------

def _held(ids, prompt_len, k=4):
    from specopd_trainer.adapt.slices import held_out

    return held_out(ids[:prompt_len], k)


def test_reader_counts_and_skips_bad_items_and_holds_out_by_prompt_hash():
    from specopd_trainer.adapt.reader import Cursor, ReaderCounts, TrafficReader

    sp = FakeSpool()
    for seq in range(1, 9):
        sp.add(seq, _seq_ids(seq, 20), 6)
    sp.items[1]["prompt_len"] = 40  # truncated: the prompt is longer than the ids
    sp.items[2].pop("trace")  # malformed: a key is missing
    sp.items[3]["input_ids"][5] = 5000  # outside the vocabulary
    sp.items[4]["trace"][0]["anchor"] = 99  # a record outside the sequence
    counts = ReaderCounts()
    reader = TrafficReader(sp, Cursor(), counts, holdout_every=4, vocab_size=97, max_items=64)
    got = reader.read()
    assert [it.seq for it in got] == [1, 6, 7, 8]
    assert [it.held_out for it in got] == [_held(_seq_ids(s, 20), 6) for s in (1, 6, 7, 8)]  # by the prompt alone
    assert counts.bad_items == {"truncated": 1, "malformed": 1, "token_out_of_vocab": 1, "trace_out_of_range": 1}
    assert counts.items == 4 and counts.held_out == sum(it.held_out for it in got) and reader.cursor.after == 8
    assert reader.read() == []  # the cursor moved on: nothing is read twice
    sp.add(9, _seq_ids(9, 20), 6)
    assert [it.seq for it in reader.read()] == [9]
    sp.spool_id = "spool-b"  # the server restarted: its spool starts again
    assert [it.key for it in reader.read()][:1] == ["spool-b:1"] and counts.spool_restarts == 1


def test_reader_counts_a_malformed_page_without_moving():
    from specopd_trainer.adapt.reader import Cursor, ReaderCounts, TrafficReader

    class BadPage(FakeSpool):
        def traffic_page(self, *a):
            return {"items": "not a list"}

    counts = ReaderCounts()
    reader = TrafficReader(BadPage(), Cursor(spool_id="x", after=3), counts, holdout_every=2, vocab_size=97)
    assert reader.read() == [] and counts.bad_pages == 1 and reader.cursor.after == 3


def test_no_heldout_prompt_in_any_training_buffer(tmp_path):
    """Traffic repeats prompts (at T=0 with the same response): read through the reader into the adapter's buffers,
    no prompt of a held-out request is ever in the training buffer, and ~1/holdout_every of the prompts are held
    out. (Held out by request number, a repeated prompt lands on both sides: this test fails on that.)"""
    sp = FakeSpool()
    prompts = [_run_ids(p, 40)[:8] for p in range(40)]  # 40 distinct prompts, each sent 5 times
    g = torch.Generator().manual_seed(0)
    order = torch.randint(len(prompts), (200,), generator=g).tolist()
    for seq, p in enumerate(order, start=1):
        sp.add(seq, prompts[p] + _run_ids(1000 + seq, 40)[8:], 8)
    ad = _adapter(sp, Pushes(sp), tmp_path / "run", holdout_every=4)
    while ad.ingest():
        pass
    assert len(ad.train_buf) + len(ad.hold_buf) == 200
    held = {tuple(s.token_ids[:s.prompt_len].tolist()) for s in ad.hold_buf.sequences}
    trained = {tuple(s.token_ids[:s.prompt_len].tolist()) for s in ad.train_buf.sequences}
    assert held and trained and not held & trained, "a held-out prompt is in the training buffer"
    distinct = {tuple(p) for p in (prompts[i] for i in order)}
    assert 0.1 <= len(held) / len(distinct) <= 0.4  # ~1/4 of the distinct prompts


def test_slices_key_the_first_tokens_after_the_header_and_pool_the_rare_ones():
    from specopd_trainer.adapt.slices import OTHER, SliceKeyer, majority_header

    header = [1, 2, 3, 4]
    task = header + [50, 51, 52]  # a task template: its own slice once seen 2 times
    agent = [1, 2, 9, 9, 9]  # its own system prompt: the header ends at 2 tokens, then the agent's prompt
    assert majority_header([header + [7], header + [8], task + [9], [5, 6]]) == header  # 3 of 4 share it
    seen = {}
    keyer = SliceKeyer(header, 3, 2, 8, seen)
    assert keyer.slice_of(task + [60, 61]) == OTHER  # first time: pooled
    first = keyer.slice_of(task + [70])
    assert first != OTHER and keyer.slice_of(task + [80, 81, 82]) == first  # the same first 3 tokens after the header
    assert keyer.slice_of(agent + [1]) == OTHER and keyer.slice_of(agent + [2]) not in (OTHER, first)
    assert keyer.slice_of(header + [99, 98, 97]) == OTHER  # a one-off prompt
    small = SliceKeyer(header, 3, 1, 1, {})  # room for one slice only
    assert small.slice_of(task) != OTHER and small.slice_of(agent) == OTHER


def test_held_out_slices_keep_their_size_after_a_shift(tmp_path):
    """Per slice at most N held-out requests, the oldest of that slice dropped: 200 requests of a new slice after a
    shift leave the old slices' held-out items in place (one FIFO window would have pushed them all out); the drops
    survive a reopen."""
    from dataclasses import replace

    from specopd_trainer.adapt.buffer import TrafficBuffer

    buf = TrafficBuffer(tmp_path / "h", 2**30, per_slice=5)
    old = [replace(_tseq(f"o{s}:{i}"), slice=f"old{s}") for i in range(8) for s in range(2)]
    buf.add(old)
    assert {k: len(v) for k, v in buf.by_slice().items()} == {"old0": 5, "old1": 5}
    assert [s.id for s in buf.by_slice()["old0"]] == [f"o0:{i}" for i in range(3, 8)]  # the newest 5 of it
    for j in range(20):
        buf.add([replace(_tseq(f"n:{j}:{i}"), slice="new") for i in range(10)])
    sizes = {k: len(v) for k, v in buf.by_slice().items()}
    assert sizes == {"old0": 5, "old1": 5, "new": 5} and buf.counts["evicted"] == 6 + 195
    again = TrafficBuffer(tmp_path / "h", 2**30, per_slice=5)
    assert [s.id for s in again.sequences] == [s.id for s in buf.sequences]
    assert again.add([_tseq("o0:0")]) == 0  # a dropped request read again (a resume) stays dropped
    tight = TrafficBuffer(tmp_path / "t", 3 * _tseq("x").nbytes, per_slice=5)  # bytes: the largest slice gives way
    tight.add([replace(_tseq(f"a{i}"), slice="a") for i in range(2)] + [replace(_tseq("b0"), slice="b")])
    tight.add([replace(_tseq("a9"), slice="a")])
    assert [s.id for s in tight.sequences] == ["a1", "b0", "a9"]


# ---- buffer ---------------------------------------------------------------------------------------------------------

def _tseq(key, n=24, served_by=("v",)):
    from specopd_trainer.adapt.buffer import TrafficSequence

    ids = _seq_ids(hash(key) % 1000, n)
    return TrafficSequence(id=key, domain="traffic", token_ids=torch.tensor(ids), features=_features(ids).bfloat16(),
                           prompt_len=6, records=({"anchor": 5, "proposed": [1, 2, 3], "accepted": 0,
                                                   "drafter_version": "v"},), served_by=served_by)


def test_buffer_caps_bytes_persists_and_never_holds_a_key_twice(tmp_path):
    from specopd_trainer.adapt.buffer import TrafficBuffer

    one = _tseq("s:1").nbytes
    assert one == 24 * 4 + 24 * D * 2
    buf = TrafficBuffer(tmp_path / "b", max_bytes=3 * one)
    assert buf.add([_tseq("s:1"), _tseq("s:2")]) == 2
    assert buf.add([_tseq("s:2"), _tseq("s:3")]) == 1 and buf.counts["duplicates"] == 1
    assert buf.add([_tseq("s:4")]) == 1  # 4 sequences > 3: the oldest shard (s:1, s:2) goes
    assert [s.id for s in buf.sequences] == ["s:3", "s:4"] and buf.counts["evicted"] == 2
    assert buf.nbytes <= 3 * one
    again = TrafficBuffer(tmp_path / "b", max_bytes=3 * one)
    assert [s.id for s in again.sequences] == ["s:3", "s:4"]
    assert torch.equal(again.sequences[0].token_ids, buf.sequences[0].token_ids)
    assert again.sequences[0].records == buf.sequences[0].records and again.counts["evicted"] == 2


def test_buffer_ignores_a_shard_written_after_the_last_index(tmp_path):
    from specopd_trainer.adapt.buffer import TrafficBuffer

    buf = TrafficBuffer(tmp_path / "b", max_bytes=10**7)
    buf.add([_tseq("s:1")])
    index = (tmp_path / "b" / "index.json").read_bytes()
    buf.add([_tseq("s:2")])
    (tmp_path / "b" / "index.json").write_bytes(index)  # killed between the shard and the index write
    again = TrafficBuffer(tmp_path / "b", max_bytes=10**7)
    assert [s.id for s in again.sequences] == ["s:1"]
    assert sorted(p.name for p in (tmp_path / "b").glob("shard-*")) == ["shard-0000000.safetensors"]
    assert again.add([_tseq("s:2")]) == 1  # read again after the resume: added once


# ---- features -------------------------------------------------------------------------------------------------------

def test_served_features_fill_the_cached_prefix_once_and_fall_back_to_scoring():
    """Item 1's cached prefix is scored once; item 2 shares it and copies item 1's rows; item 3 is scored whole."""
    from specopd_trainer.adapt.features import FeatureSource
    from specopd_trainer.adapt.reader import Cursor, ReaderCounts, TrafficReader

    sp = FakeSpool(prefix=5)  # a radix-cached 5-token system prompt: rows 0..4 were not recomputed
    shared = [9, 9, 8, 7, 6]
    sp.add(1, shared + _seq_ids(1, 20)[5:], 8)
    sp.add(2, shared + _seq_ids(2, 16)[5:], 8)
    sp.add(3, _seq_ids(3, 12), 6, features=False)  # no captured rows (e.g. evicted): second pass
    items = TrafficReader(sp, Cursor(), ReaderCounts(), holdout_every=100, vocab_size=97).read()
    src = FeatureSource(sp, [1])
    feats = src.features(items)
    for it in items:
        want = _features(it.input_ids)
        got = feats[it.key].float()
        assert got.shape == (len(it.input_ids), D)
        assert torch.allclose(got[:-1], want[:-1].bfloat16().float())  # captured + prefix rows, bf16
        if it.features is not None:
            assert torch.equal(got[-1], got[-2])  # the never-computed last row is padded, never read
    assert src.counts == {"served": 2, "scored": 1, "prefix_copies": 1, "prefix_calls": 1, "served_tokens": 36,
                          "scored_tokens": 12, "prefix_tokens": 5}
    assert sp.score_calls == 2  # one prefix fill (the second item copies the first's rows) + one second pass


# ---- guard ----------------------------------------------------------------------------------------------------------

def _rows(taus):
    return [{"id": f"r{i}", "domain": "traffic", "completion_tokens": int(round(t * 10)), "verify_steps": 10}
            for i, t in enumerate(taus)]


def test_guard_deploys_only_a_candidate_better_beyond_the_noise():
    from specopd_trainer.adapt.guard import compare, pooled_tau, worse

    dep = _rows([1.0, 1.2, 1.4, 1.1, 1.3, 1.0, 1.2, 1.5])
    better = _rows([t + 0.3 for t in [1.0, 1.2, 1.4, 1.1, 1.3, 1.0, 1.2, 1.5]])
    v = compare(better, dep)
    assert v.deploy and v.diff == pytest.approx(0.3) and v.ci95[0] == pytest.approx(0.3) and v.requests == 8
    assert pooled_tau(dep) == pytest.approx(9.7 / 8)
    worse_c = _rows([t - 0.2 for t in [1.0, 1.2, 1.4, 1.1, 1.3, 1.0, 1.2, 1.5]])
    v = compare(worse_c, dep)
    assert not v.deploy and worse(v) and v.diff == pytest.approx(-0.2)
    assert not compare(dep, dep).deploy  # equal: interval [0, 0]
    mixed = _rows([1.3, 1.0, 1.7, 1.0, 1.6, 0.9, 1.5, 1.3])  # mean +0.1, but half the requests got worse
    v = compare(mixed, dep)
    assert not v.deploy and v.ci95[0] < 0 < v.ci95[1]
    assert compare(mixed, dep, rule="mean").deploy  # the mean rule would take it
    with pytest.raises(ValueError):
        compare(mixed, dep, rule="vote")


# ---- the loop -------------------------------------------------------------------------------------------------------

class Pushes:
    def __init__(self, spool):
        self.spool, self.versions = spool, []

    def __call__(self, drafter, version):
        self.versions.append(version)
        self.spool.version = version


def _spool_with_traffic(n=48, length=40):
    sp = FakeSpool()
    for seq in range(1, n + 1):
        sp.add(seq, _run_ids(seq, length), 8)
    return sp


def _adapter(sp, pushes, run_dir, **overrides):
    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.adapt.loop import Adapter

    cfg = AdaptConfig(**{"min_holdout": 4, "holdout_window": 4, "holdout_every": 4, "eval_every": 40, "min_train_tokens": 64,
                         "lr": 1e-2, "warmup_steps": 2, "poll_s": 0.01, "ckpt_every": 10, "max_steps": 200, "retain": 0.0, "rehearsal": 0.0,
                         "algorithm_options": {"seqs_per_step": 4, "anchors_per_seq": 8}, **overrides})
    return Adapter(sp, tiny_drafter(seed=0), run_dir, cfg, push=pushes, serving_version=lambda: sp.version,
                   progress=False, sleep=lambda s: None)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """An adapter run of 200 steps on learnable traffic (shared: the tests below copy it before changing it)."""
    sp = _spool_with_traffic()
    pushes = Pushes(sp)
    ad = _adapter(sp, pushes, tmp_path_factory.mktemp("adapt") / "run")
    start = copy.deepcopy(ad.drafter.state_dict())
    return ad, ad.run(), pushes, start


def _copy(trained):
    """A copy of the trained adapter to change (its status printer, which holds stderr, is shared)."""
    ad = copy.deepcopy(trained[0], memo={id(trained[0].status): trained[0].status})
    pushes = Pushes(ad.client)
    ad.push_fn = pushes
    return ad, pushes


def test_adapter_learns_the_traffic_and_pushes_a_better_candidate(trained):
    ad, out, pushes, start = trained
    sp = ad.client
    assert out["stopped_by"] == "max_steps" and out["step"] == 200
    n_held = sum(_held(_run_ids(s, 40), 8) for s in range(1, 49))  # 8 of 48 prompts by their hash
    assert out["holdout_items"] == n_held and out["train_items"] == 48 - n_held  # held out: never trained on
    cands = [v for v in out["verdicts"] if v["kind"] == "candidate"]
    assert len(cands) == 5 and cands[0]["requests"] == 4  # the newest 4; the older 4 judged apart
    assert out["pushes"] >= 1 and pushes.versions[0] == "adapt-run-1" and sp.version == out["deployed_version"]
    first = next(v for v in cands if v["deploy"])
    assert first["candidate_tau"] > first["deployed_tau"] and first["ci95"][0] > 0
    assert out["deployed"][0]["version"] == "initial" and out["deployed"][1]["why"].startswith("candidate interval")
    assert not torch.equal(ad.deployed.state_dict()["fc.weight"], start["fc.weight"])
    rows = [json.loads(x) for x in (ad.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["step"] <= 200


def test_the_guard_never_deploys_a_worse_candidate(trained):
    ad, pushes = _copy(trained)
    with torch.no_grad():  # a broken candidate: the deployed (trained) drafter plus large noise
        g = torch.Generator().manual_seed(3)
        for name, p in ad.drafter.named_parameters():
            p.copy_(ad.deployed.get_parameter(name) + torch.randn(p.shape, generator=g) * 3)
    verdict = ad.judge()
    assert verdict["deploy"] is False and verdict["diff"] < 0 and verdict["ci95"][1] < 0
    assert pushes.versions == [] and ad.client.version == ad.state.deployed_version


def test_rollback_when_the_deployed_drafter_measures_worse_than_the_one_before(trained, monkeypatch):
    import specopd_trainer.adapt.judge as judge_mod

    ad, pushes = _copy(trained)
    good = copy.deepcopy(ad.deployed.state_dict())
    with torch.no_grad():  # pretend a bad drafter was deployed after the good one
        g = torch.Generator().manual_seed(5)
        for p in ad.deployed.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 3)
    ad.previous = good
    ad.state.deployed.append({"version": "bad", "step": 200, "t_s": 0.0, "why": "test"})
    ad.drafter.load_state_dict(ad.deployed.state_dict())  # the candidate is no better than the deployed one
    ad._dep_cache.clear()
    ad.cfg = ad.cfg.model_copy(update={"holdout_window": 48})  # the rollback check on every held-out request
    # (8 held-out requests: the walks are stand-ins, the broken deployed and candidate drafters 1.2, the one before 1.5)
    monkeypatch.setattr(judge_mod, "walk_rows", lambda d, seqs, cache=None: [
        {"id": s.id, "domain": "traffic", "verify_steps": 10,
         "completion_tokens": 12 if d is ad.deployed or d is ad.drafter else 15} for s in seqs])
    ad.judge()
    previous_version = ad.state.deployed[-3]["version"]
    assert ad.state.rollbacks == trained[1]["rollbacks"] + 1
    assert pushes.versions == [f"{previous_version}-rollback"] and ad.client.version == pushes.versions[0]
    assert torch.equal(ad.deployed.state_dict()["fc.weight"], good["fc.weight"])
    assert torch.equal(ad.drafter.state_dict()["fc.weight"], good["fc.weight"])  # the candidate restarts from it


def test_adapter_resumes_where_it_stopped(tmp_path):
    sp = _spool_with_traffic(n=24)
    pushes = Pushes(sp)
    first = _adapter(sp, pushes, tmp_path / "run", max_steps=12)
    out1 = first.run()
    weights = copy.deepcopy(first.drafter.state_dict())
    for seq in range(25, 33):
        sp.add(seq, _run_ids(seq, 40), 8)
    second = _adapter(sp, pushes, tmp_path / "run", max_steps=20)
    assert second.state.step == 12 and second.state.cursor.after == 24
    assert all(torch.equal(weights[k], v) for k, v in second.drafter.state_dict().items())
    n_train = [sum(not _held(_run_ids(s, 40), 8) for s in range(1, n + 1)) for n in (24, 32)]
    assert len(second.train_buf) == out1["train_items"] == n_train[0]
    out2 = second.run()
    assert out2["step"] == 20 and out2["train_items"] == n_train[1] and out2["reader"]["items"] == 32
    assert second.train_buf.counts["duplicates"] == 0


def test_adapter_refuses_an_algorithm_without_an_adapt_step(tmp_path):
    from specopd_trainer.adapt.loop import AdaptError

    with pytest.raises(AdaptError, match="cannot learn from traffic"):
        _adapter(FakeSpool(), Pushes(FakeSpool()), tmp_path / "r", algorithm="sequential-opd")


def test_a_new_run_can_start_at_the_newest_item(tmp_path):
    sp = _spool_with_traffic(n=8)
    ad = _adapter(sp, Pushes(sp), tmp_path / "run", start_at="newest", max_steps=1)
    assert ad.state.cursor.after == 8 and ad.reader.read() == []
    sp.add(9, _run_ids(9, 40), 8)
    assert [it.seq for it in ad.reader.read()] == [9]


def test_a_candidate_worse_on_older_traffic_is_not_deployed(tmp_path, monkeypatch):
    """Better on the newest held-out requests (a new domain) but worse on the older ones (forgetting): kept out."""
    import specopd_trainer.adapt.judge as loop

    sp = _spool_with_traffic(n=200)  # 50 held out: 48 newest + the older ones
    pushes = Pushes(sp)
    ad = _adapter(sp, pushes, tmp_path / "run", max_steps=1, holdout_window=20, holdout_older=20, min_holdout=6)
    ad.run()
    recent = {s.id for s in ad.hold_buf.sequences[-20:]}

    def fake_rows(drafter, seqs, cache=None):  # tau 2.0 / 1.2 on recent, 1.0 / 1.5 on older (candidate / deployed)
        cand = drafter is ad.drafter
        return [{"id": s.id, "domain": "traffic", "verify_steps": 10,
                 "completion_tokens": (20 if cand else 12) if s.id in recent else (10 if cand else 15)} for s in seqs]

    monkeypatch.setattr(loop, "walk_rows", fake_rows)
    v = ad.judge()
    assert v["ci95"][0] > 0 and v["older"]["ci95"][1] < 0  # better on the newest, worse on the older
    assert v["deploy"] is False and "worse on older traffic" in v["reason"] and pushes.versions == []
    monkeypatch.setattr(loop, "walk_rows", lambda d, seqs, cache=None: [
        {"id": s.id, "domain": "traffic", "verify_steps": 10,
         "completion_tokens": (20 if d is ad.drafter else 12) if s.id in recent else 15} for s in seqs])
    v = ad.judge()  # equal on the older traffic: deployed
    assert v["deploy"] is True and v["older"]["ci95"] == [0.0, 0.0] and len(pushes.versions) == 1


def test_small_losses_per_push_cannot_add_up_on_older_traffic(tmp_path, monkeypatch):
    """Equal to the deployed drafter on the older held-out requests, but worse there than the run's start drafter (a
    deployed drafter that already lost a little): kept out; equal to the start: deployed."""
    import specopd_trainer.adapt.judge as loop

    sp = _spool_with_traffic(n=200)
    pushes = Pushes(sp)
    ad = _adapter(sp, pushes, tmp_path / "run", max_steps=1, holdout_window=20, holdout_older=20, min_holdout=6)
    ad.run()
    recent = {s.id for s in ad.hold_buf.sequences[-20:]}
    start_older = {"tokens": 16}

    def fake_rows(drafter, seqs, cache=None):  # older: candidate 14, deployed 14, start 16 (then 14) per 10 steps
        if drafter is ad.anchor:
            older = start_older["tokens"]
        else:
            older = 14
        return [{"id": s.id, "domain": "traffic", "verify_steps": 10,
                 "completion_tokens": (20 if drafter is ad.drafter else 12) if s.id in recent else older} for s in seqs]

    monkeypatch.setattr(loop, "walk_rows", fake_rows)
    v = ad.judge()
    assert v["older"]["ci95"] == [0.0, 0.0] and v["older_vs_start"]["ci95"][1] < 0
    assert v["deploy"] is False and "than the start drafter" in v["reason"] and pushes.versions == []
    start_older["tokens"] = 14
    v = ad.judge()
    assert v["deploy"] is True and v["older_vs_start"]["ci95"] == [0.0, 0.0] and len(pushes.versions) == 1


def test_retention_loss_is_the_kl_to_the_start_on_the_slots_it_got_right():
    """Two slots over a 2-token vocabulary: the start (anchor) is right on slot 0 only, so the loss is slot 0's
    KL(anchor || drafter) = sum_v p_v log(p_v / q_v), computed by hand; no qualifying slot gives 0."""
    import math

    from specopd_trainer.algorithms.sft.adapt import retention_loss

    p = [0.8, 0.2]
    q = [0.5, 0.5]
    anchor = torch.log(torch.tensor([[[0.8, 0.2], [0.6, 0.4]]]))  # [1 block, 2 slots, V=2], argmax 0 and 0
    drafter = torch.log(torch.tensor([[[0.5, 0.5], [0.1, 0.9]]])).requires_grad_()
    labels = torch.tensor([[0, 1]])  # slot 0 right, slot 1 wrong
    loss = retention_loss(anchor, drafter, labels)
    want = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    assert loss.item() == pytest.approx(want, rel=1e-6)
    loss.backward()
    assert drafter.grad[0, 1].abs().sum() == 0  # the wrong slot is not pulled towards the start
    assert retention_loss(anchor, drafter, torch.tensor([[1, -100]])).item() == 0.0


def test_start_well_is_the_start_drafters_walk():
    """The retention weight of a request: 0.05 + the start drafter's accepted drafts per verify step in its greedy
    walk over the served response. By hand, block 4, prompt 4, 12 tokens: a drafter that always proposes the served
    tokens walks 4 -> 8 (3 accepted, 4 emitted) -> 12 (3 accepted, 3 emitted: the end), 7 emitted in 2 steps, so
    0.05 + 5 / 2 = 2.55; one that never does accepts nothing: 0.05."""
    from types import SimpleNamespace

    from specopd_trainer.algorithms.sft.adapt import start_well

    ids = torch.arange(100, 112)

    class Oracle(torch.nn.Module):
        def __init__(self, right):
            super().__init__()
            self.right = right

        def propose_blocks(self, features, token_ids, anchors):
            rows = [[int(token_ids[a + k]) if a + k < len(token_ids) else -1 for k in (1, 2, 3)] for a in anchors]
            return torch.tensor(rows) if self.right else torch.full((len(anchors), 3), -1)

    seq = SimpleNamespace(token_ids=ids, features=torch.zeros(12, 2), prompt_len=4)
    good, bad = Oracle(True), Oracle(False)
    good.train()
    assert start_well(good, seq) == pytest.approx(2.55) and good.training  # its mode is restored
    assert start_well(bad, seq) == pytest.approx(0.05)


def test_retention_draws_what_the_start_drafter_did_well(tmp_path, monkeypatch):
    """With retain on, one request of each step (of 4) trains the retention loss, drawn by :func:`start_well` of the
    start drafter, computed once per request: with one request (spool seq 6) weighing 1e9 and the rest 1e-9 the
    retention forward of every step is that request's."""
    import specopd_trainer.algorithms.sft.adapt as sft_adapt

    sp = _spool_with_traffic(n=24)
    calls = []

    def fake_start_well(anchor, seq):
        assert anchor is ad.anchor
        calls.append(seq.id)
        return 1e9 if seq.id.endswith(":6") else 1e-9

    monkeypatch.setattr(sft_adapt, "start_well", fake_start_well)
    ad = _adapter(sp, Pushes(sp), tmp_path / "run", retain=0.25, max_steps=1)
    ad.run()
    (fav,) = [s for s in ad.train_buf.sequences if s.id.endswith(":6")]
    seen = []
    real = ad.anchor.logits
    monkeypatch.setattr(ad.anchor, "logits", lambda f, ids, a: seen.append(ids is fav.token_ids) or real(f, ids, a))
    for i in range(3):
        _, m = ad.step_fn(torch.Generator().manual_seed(i))
        assert m["retained_slots"] >= 0 and m["supervised_tokens"] == 3 * 8 * 3  # 3 CE requests x 8 anchors x G=3
    assert seen == [True] * 3
    assert sorted(calls) == sorted(s.id for s in ad.train_buf.sequences)  # each request weighed once


# ---- the guard per slice (synthetic per-item taus) ------------------------------------------------------------------

def _judge_case(monkeypatch, slices, cand_delta, **cfg_over):
    """A stand-in adapter whose held-out requests are ``slices`` [(slice, n)] oldest first; per request the deployed
    and start drafters walk tau 1.5 + 0.1 * (i % 3), the candidate that plus ``cand_delta[slice]``."""
    import specopd_trainer.adapt.judge as judge_mod
    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.adapt.state import AdaptState

    hold = [SimpleNamespace(id=f"{name}{i}", slice=name) for name, n in slices for i in range(n)]
    base = {s.id: 1.5 + 0.1 * (i % 3) for i, s in enumerate(hold)}
    cand, dep, start = object(), object(), object()

    def rows(drafter, seqs, cache=None):
        return [{"id": s.id, "domain": "traffic", "verify_steps": 10,
                 "completion_tokens": round(10 * (base[s.id] + (cand_delta[s.slice] if drafter is cand else 0)))}
                for s in seqs]

    monkeypatch.setattr(judge_mod, "walk_rows", rows)
    pushed = []
    cfg = AdaptConfig(**{"holdout_window": 12, "min_holdout": 6, "holdout_older": 48, **cfg_over})
    ad = SimpleNamespace(cfg=cfg, state=AdaptState(), hold_buf=SimpleNamespace(sequences=hold), drafter=cand,
                         deployed=dep, anchor=start, _dep_cache={}, _start_cache={}, previous=None,
                         next_version=lambda: "adapt-x-1",
                         deploy_candidate=lambda version, why: pushed.append(version) or True)
    return judge_mod.judge(ad), pushed


def test_a_candidate_worse_on_one_slice_is_refused_naming_the_slice(monkeypatch):
    # older: coding (12, worse by 0.2) and agentic (12, better); newest 12: wordsort, better by 0.5
    v, pushed = _judge_case(monkeypatch, [("coding", 12), ("agentic", 12), ("wordsort", 12)],
                            {"coding": -0.2, "agentic": 0.4, "wordsort": 0.5})
    assert v["ci95"][0] > 0  # better overall on the newest traffic
    assert v["slices"]["coding"]["passed"] is False and v["slices"]["coding"]["ci95"][0] < -0.02
    assert v["slices"]["agentic"]["passed"] and v["slices"]["wordsort"]["passed"]
    assert v["deploy"] is False and pushed == [] and "worse on slice coding than the deployed drafter" in v["reason"]
    assert v["slices_vs_start"]["coding"]["passed"] is False


def test_a_small_slice_is_reported_not_judged_and_does_not_block(monkeypatch):
    # older: agentic (12, better), japanese (3 < guard_min_slice_items, worse); newest 12: wordsort, better
    v, pushed = _judge_case(monkeypatch, [("agentic", 12), ("japanese", 3), ("wordsort", 12)],
                            {"agentic": 0.4, "japanese": -0.3, "wordsort": 0.5}, guard_min_slice_items=8)
    assert v["deploy"] is True and pushed == ["adapt-x-1"] and v["pushed"] == "adapt-x-1"
    assert v["slices"]["japanese"] == {"items": 3, "ran": False, "passed": None,
                                       "why": "3 held-out requests < 8: not judged"}
    assert v["not_judged"] == ["japanese"] and "slices not judged" in v["reason"] and "japanese" in v["reason"]
    assert v["older"]["ran"] and v["older"]["passed"]


def test_a_check_that_could_not_run_blocks_the_push_and_says_so(monkeypatch):
    # 12 held-out requests, all inside the newest window: no older traffic to check (issue 51's silent deploy)
    v, pushed = _judge_case(monkeypatch, [("wordsort", 12)], {"wordsort": 0.5})
    assert v["ci95"][0] > 0 and v["deploy"] is False and pushed == []
    assert v["older"]["ran"] is False and v["older_vs_start"]["ran"] is False
    assert "the older-traffic check (vs the deployed drafter) could not run" in v["reason"]
    v, pushed = _judge_case(monkeypatch, [("wordsort", 4)], {"wordsort": 0.5})  # < min_holdout: overall not run
    assert v["ran"] is False and v["deploy"] is False and "not judged" in v["reason"] and pushed == []


def test_after_a_shift_every_step_still_draws_old_slices_in_the_configured_share():
    """The training buffer holds only the new slice (its FIFO dropped the old traffic); the rehearsal buffer holds
    old0, old1 and new. Over every index of the view (what a uniform draw sees): rehearsal 0.25 of it, spread evenly
    over the 3 slices, so old slices get 0.25 * 2/3 of every step's requests; sampled as SFT draws, the same."""
    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.adapt.view import TrainView

    new = [SimpleNamespace(id=f"n{i}", slice="new") for i in range(90)]
    reh = {"old0": [SimpleNamespace(id=f"a{i}", slice="old0") for i in range(5)],
           "old1": [SimpleNamespace(id=f"b{i}", slice="old1") for i in range(7)], "new": new[-10:]}
    view = TrainView(SimpleNamespace(cfg=AdaptConfig(rehearsal=0.25), _train_view=new, _rehearsal_view=reh))
    assert len(view) == 90 + 30  # 30 / 120 = 0.25
    drawn = [view[i].slice for i in range(len(view))]
    assert drawn.count("old0") == drawn.count("old1") == 10 and drawn.count("new") == 100
    assert {view[i].id for i in range(len(view)) if view[i].slice == "old1"} == {f"b{i}" for i in range(7)}
    g = torch.Generator().manual_seed(0)
    picks = torch.randint(len(view), (4000,), generator=g).tolist()
    old_share = sum(view[i].slice != "new" for i in picks) / len(picks)
    assert abs(old_share - 0.25 * 2 / 3) < 0.03
    off = TrainView(SimpleNamespace(cfg=AdaptConfig(rehearsal=0.0), _train_view=new, _rehearsal_view=reh))
    assert len(off) == 90 and list(off) == new


# ---- what the progress line says ------------------------------------------------------------------------------------

def test_the_progress_line_names_each_state_of_the_last_judgement():
    from specopd_trainer.adapt.report import status_line
    from specopd_trainer.adapt.state import AdaptState

    def line(*verdicts):
        st = AdaptState(step=300)
        for v in verdicts:
            st.note_verdict(v)
        return status_line(st, train_items=10, holdout_items=4, loss=None)

    m = {"candidate_tau": 1.316, "deployed_tau": 1.232, "diff": 0.084, "ci95": [0.016, 0.164], "requests": 12,
         "step": 100}
    assert "candidate not judged yet" in line()
    assert "candidate not judged at step 100 (not judged: 4 held-out requests < 12" in line(
        {"kind": "candidate", "step": 100, "ran": False, "deploy": False,
         "reason": "not judged: 4 held-out requests < 12 (the overall check could not run)"})
    pushed = line({**m, "kind": "candidate", "ran": True, "deploy": True, "pushed": "adapt-x-1", "reason": "ok"})
    assert "pushed adapt-x-1 at step 100" in pushed and "deployed now" in pushed and "vs deployed 1.232" not in pushed
    rejected = line({**m, "kind": "candidate", "ran": True, "deploy": False, "reason": "worse on slice s-1"},
                    {"kind": "candidate_reset", "step": 100, "why": "rollback"})
    assert "candidate rejected at step 100: 1.316 vs deployed 1.232" in rejected and "worse on slice s-1" in rejected
    assert "not judged" not in rejected  # a rejection right before is not "not judged yet"
    back = line({**m, "kind": "candidate", "ran": True, "deploy": False, "reason": "x"},
                {**m, "kind": "deployed_vs_previous", "rolled_back": True, "pushed": "initial-rollback"})
    assert "rollback check at step 100: deployed 1.316 vs previous 1.232" in back and "rolled back to initial" in back


def test_version_names_have_one_adapt_prefix(tmp_path):
    sp = _spool_with_traffic(n=4)
    assert _adapter(sp, Pushes(sp), tmp_path / "adapt-20250101-000000").next_version() == "adapt-20250101-000000-1"
    assert _adapter(sp, Pushes(sp), tmp_path / "run").next_version() == "adapt-run-1"
