"""The trainer against a fleet, over fake workers: rendezvous affinity (stable, spread), score_trees split by
reference and put back in order, failover to the next worker with nothing lost, generation through the router
unless a request needs custom_params, the fleet identity check, the target fingerprint, and where the CLI finds
the workers. The adapter over a fleet is in tests/test_fleet_adapt.py; real workers in tests/test_fleet_server.py."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from specopd_trainer.client.http import ServerRequestError, ServerUnavailableError
from specopd_trainer.fleet.routing import FleetUnavailableError, affinity_key, rendezvous_order

URLS = ["http://w0", "http://w1", "http://w2"]


class FakeWorker:
    """A worker's client: score_trees / generate / drafter_info answered in memory, every call logged; ``down``
    raises what SpecOPDClient raises after its retries; ``refuse`` a 4xx."""

    def __init__(self, url: str, info=None):
        self.url, self.down, self.refuse = url, False, None
        self.scored, self.generated, self.closed = [], [], False
        self.info = info or {"version": "initial", "arch": "dflash", "spec": {"block_size": 4, "dtype": "float32"},
                             "target": {"fingerprint": "sha256:" + "a" * 64, "dtype": "float32"}}

    def _check(self):
        if self.down:
            raise ServerUnavailableError(f"POST {self.url} failed after 2 attempts: connection refused")
        if self.refuse:
            raise ServerRequestError(400, self.refuse)

    def score_trees(self, req):
        self._check()
        self.scored.append([tuple(r.input_ids) for r in req.references])
        return [SimpleNamespace(ids=tuple(r.input_ids), worker=self.url) for r in req.references]

    def generate(self, input_ids, **kw):
        self._check()
        self.generated.append((tuple(input_ids), kw))
        return {"output_ids": [1, 2], "meta_info": {"served_by": self.url}}

    def drafter_info(self):
        self._check()
        return dict(self.info)

    def close(self):
        self.closed = True


def fleet(urls=URLS, router=None, **kw):
    from specopd_trainer.fleet.client import FleetClient

    made = {}

    def make(url):
        made[url] = FakeWorker(url)
        return made[url]

    return FleetClient(urls, router=router, client_factory=make, **kw), made


def request(refs):
    from sglang_specopd.wire.protocol import ScoreTreesRequest

    return ScoreTreesRequest(references=[{"input_ids": ids} for ids in refs], block_size=4, returns=["topk"])


def refs(n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(4, 90) for _ in range(rng.randrange(3, 12))] for _ in range(n)]


def test_rendezvous_order_is_stable_spreads_evenly_and_moves_only_a_leaving_workers_keys():
    keys = [affinity_key(ids) for ids in refs(900, seed=1)]
    firsts = [rendezvous_order(k, URLS)[0] for k in keys]
    counts = {u: firsts.count(u) for u in URLS}
    assert all(240 <= c <= 360 for c in counts.values()), counts  # 300 each expected
    assert [rendezvous_order(k, list(reversed(URLS)))[0] for k in keys] == firsts  # the list's order is irrelevant
    assert affinity_key([1, 2, 3]) == affinity_key([1, 2, 3]) != affinity_key([1, 2, 3, 0])
    without = [rendezvous_order(k, ["http://w0", "http://w2"])[0] for k in keys]
    assert all(a == b for a, b in zip(firsts, without) if a != "http://w1")  # only w1's keys moved
    assert all(rendezvous_order(k, URLS)[1] == b for k, a, b in zip(keys, firsts, without) if a == "http://w1")


def bounded(rs, urls=URLS):
    """The assignment score_trees makes: each reference to the first worker of its rendezvous order with fewer than
    ceil(len(rs) / len(urls)) references of this call."""
    cap, load, out = -(-len(rs) // len(urls)), {u: 0 for u in urls}, []
    for r in rs:
        pick = next(u for u in rendezvous_order(affinity_key(r), urls) if load[u] < cap)
        load[pick] += 1
        out.append(pick)
    return out


def test_score_trees_sends_each_reference_to_its_worker_and_answers_in_request_order():
    client, w = fleet()
    rs = refs(30, seed=2)
    out = client.score_trees(request(rs))
    assert [o.ids for o in out] == [tuple(r) for r in rs]
    want = bounded(rs)
    first = [rendezvous_order(affinity_key(r), URLS)[0] for r in rs]
    assert [o.worker for o in out] == want and sorted(want.count(u) for u in URLS) == [10, 10, 10]
    assert sum(a == b for a, b in zip(want, first)) >= 20  # affinity kept for most references
    assert all(len(w[u].scored) == 1 for u in URLS)  # one call per worker, in parallel
    again = client.score_trees(request(rs))  # the same call again: the same workers
    assert [o.worker for o in again] == want
    assert client.counts["references"] == {u: 2 * want.count(u) for u in URLS}
    pairs = [refs(2, seed=s) for s in range(40)]  # two references, two workers: never both on one
    two, _ = fleet(urls=URLS[:2])
    assert all(len({o.worker for o in two.score_trees(request(p))}) == 2 for p in pairs)
    assert [o.worker for o in two.score_trees(request(pairs[0][:1]))] == [
        rendezvous_order(affinity_key(pairs[0][0]), URLS[:2])[0]]  # one reference: its own worker


def test_a_worker_that_drops_out_is_replaced_by_the_next_in_each_references_order():
    client, w = fleet(cooldown_s=3600)
    rs = refs(30, seed=3)
    w["http://w1"].down = True
    out = client.score_trees(request(rs))
    assert [o.ids for o in out] == [tuple(r) for r in rs]  # nothing lost
    assert {o.worker for o in out} == {"http://w0", "http://w2"}
    assert client.counts["failovers"] == 1 and client.health.failures == {"http://w1": 1}
    calls = len(w["http://w1"].scored)
    client.score_trees(request(rs))  # w1 cools down: the others take its references without asking it first
    assert client.counts["failovers"] == 1 and len(w["http://w1"].scored) == calls
    w["http://w1"].down = False
    client.health.mark_up("http://w1")  # it answers again (or its cooldown ended): its references come back
    assert [o.worker for o in client.score_trees(request(rs))] == bounded(rs)


def test_ranks_split_the_workers_and_fall_back_on_the_others_only_when_theirs_fail():
    from specopd_trainer.fleet.client import rank_share

    assert [rank_share(URLS, r, 2) for r in (0, 1)] == [["http://w0", "http://w2"], ["http://w1"]]
    assert [rank_share(URLS[:1], r, 2) for r in (0, 1)] == [["http://w0"], ["http://w0"]]
    assert rank_share(URLS[:2], 2, 3) == ["http://w0"]  # fewer workers than ranks: worker rank % n
    with pytest.raises(ValueError):
        rank_share(URLS, 2, 2)
    with pytest.raises(ValueError, match="not among the workers"):
        fleet(preferred=["http://elsewhere"])
    client, w = fleet(preferred=rank_share(URLS, 0, 2))
    many = refs(40, seed=3)
    client.score_trees(request(many))
    assert w["http://w1"].scored == [] and sum(len(c) for c in w["http://w0"].scored + w["http://w2"].scored) == 40
    assert {len(w["http://w0"].scored), len(w["http://w2"].scored)} == {1}  # both of this rank's workers, once
    w["http://w0"].down = w["http://w2"].down = True
    out = client.score_trees(request(many[:5]))
    assert [o.worker for o in out] == ["http://w1"] * 5 and [o.ids for o in out] == [tuple(r) for r in many[:5]]


def test_every_worker_down_is_one_error_and_a_bad_request_is_never_retried_elsewhere():
    client, w = fleet()
    for fw in w.values():
        fw.down = True
    with pytest.raises(FleetUnavailableError, match="every worker failed") as err:
        client.score_trees(request(refs(4)))
    assert {u for u, _ in err.value.failures} <= set(URLS) and isinstance(err.value, ServerUnavailableError)
    client, w = fleet()
    rs = refs(1, seed=4)
    first = rendezvous_order(affinity_key(rs[0]), URLS)[0]
    w[first].refuse = "block_size must be the drafter's"
    with pytest.raises(ServerRequestError, match="block_size"):
        client.score_trees(request(rs))
    assert all(fw.scored == [] for fw in w.values()) and client.counts["failovers"] == 0


def test_generation_goes_through_the_router_unless_it_needs_custom_params():
    client, w = fleet(router="http://router")
    client.generate([5, 6, 7], max_new_tokens=4)
    assert w["http://router"].generated == [((5, 6, 7), {"max_new_tokens": 4, "temperature": 0.0, "trace": False})]
    first = rendezvous_order(affinity_key([5, 6, 7]), URLS)[0]
    client.generate([5, 6, 7], max_new_tokens=4, trace=True)  # the router drops custom_params: a worker directly
    client.generate([5, 6, 7], max_new_tokens=4, custom_params={"specopd_spool": False})
    assert len(w[first].generated) == 2 and len(w["http://router"].generated) == 1
    assert client.counts["generate_router"] == 1 and client.counts["generate_direct"] == 2
    w[first].down = True  # a direct request fails over too
    out = client.generate([5, 6, 7], max_new_tokens=4, trace=True)
    assert out["meta_info"]["served_by"] == rendezvous_order(affinity_key([5, 6, 7]), URLS)[1]
    w["http://router"].down = True  # the router down: plain generation goes to the workers directly
    failovers = client.counts["failovers"]
    out = client.generate([8, 9], max_new_tokens=4)
    assert out["meta_info"]["served_by"] in URLS and client.counts["failovers"] == failovers + 1
    no_router, w2 = fleet()
    no_router.generate([1], max_new_tokens=2)
    assert sum(len(fw.generated) for fw in w2.values()) == 1
    client.close()
    assert all(fw.closed for fw in w.values())


def test_the_fleet_check_refuses_workers_serving_another_target_or_drafter():
    from specopd_trainer.fleet.check import FleetMismatchError

    client, w = fleet()
    ident = client.check()
    assert ident.fingerprint == "sha256:" + "a" * 64 and ident.arch == "dflash" and ident.version == "initial"
    w["http://w2"].info["version"] = "v7"  # versions may differ (a push brings them to one)
    assert client.check().version is None and client.drafter_info()["versions"]["http://w2"] == "v7"
    w["http://w2"].info["spec"] = {"block_size": 4, "dtype": "bfloat16"}  # the weights' dtype is not the drafter
    client.check()
    w["http://w1"].info["target"] = {"fingerprint": "sha256:" + "b" * 64, "dtype": "float32"}
    with pytest.raises(FleetMismatchError, match=r"target \(fingerprint of its checkpoint\) differs: "
                                                 r"sha256:aaaaaaaaaaaa\.\.\. on http://w0, http://w2; "
                                                 r"sha256:bbbbbbbbbbbb\.\.\. on http://w1"):
        client.check()
    w["http://w1"].info["target"] = dict(w["http://w0"].info["target"], dtype="bfloat16")
    with pytest.raises(FleetMismatchError, match="served dtype differs: float32 on http://w0, http://w2; bfloat16 on "
                                                 "http://w1$"):
        client.check()
    w["http://w1"].info["target"] = w["http://w0"].info["target"]
    w["http://w1"].info["arch"] = "dspark"
    with pytest.raises(FleetMismatchError, match="drafter architecture differs: dflash on http://w0, http://w2; "
                                                 "dspark on http://w1"):
        client.check()
    w["http://w1"].info.update(arch="dflash", spec={"block_size": 8})
    with pytest.raises(FleetMismatchError, match="drafter spec differs"):
        client.check()
    w["http://w1"].info.pop("target")
    with pytest.raises(FleetMismatchError, match="http://w1 do.es. not report the target"):
        client.check()
    w["http://w1"].down = True
    with pytest.raises(ServerUnavailableError, match="not answering GET /specopd/drafter: http://w1"):
        client.check()


def _checkpoint(root, tensors, config=None, tokenizer=b'{"model": {"vocab": {"a": 0}}}'):
    import json

    from safetensors.torch import save_file

    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config or {"model_type": "llama", "hidden_size": 8,
                                                            "transformers_version": "4.50.0"}))
    (root / "tokenizer.json").write_bytes(tokenizer)
    for name, part in tensors.items():
        save_file(part, str(root / name))
    return root


def test_the_target_fingerprint_tells_models_apart_but_not_copies(tmp_path):
    import torch

    from sglang_specopd.wire.target_fingerprint import FingerprintError, target_fingerprint

    g = torch.Generator().manual_seed(0)
    big, small = torch.randn(64, 64, generator=g), torch.randn(3, generator=g)  # 16 KiB: its middle is not read
    base = target_fingerprint(_checkpoint(tmp_path / "a", {"model.safetensors": {"w": big, "b": small}}))
    assert base.startswith("sha256:") and len(base) == 7 + 64
    resharded = _checkpoint(tmp_path / "b", {"m-1.safetensors": {"b": small}, "m-2.safetensors": {"w": big}},
                            config={"hidden_size": 8, "model_type": "llama", "transformers_version": "4.57.1",
                                    "_name_or_path": "/elsewhere"})
    assert target_fingerprint(resharded) == base  # another sharding, another transformers, another directory
    other = big.clone()
    other[0, 0] += 1e-3
    assert target_fingerprint(_checkpoint(tmp_path / "c", {"model.safetensors": {"w": other, "b": small}})) != base
    assert target_fingerprint(_checkpoint(tmp_path / "d", {"model.safetensors": {"w": big.bfloat16(),
                                                                                  "b": small}})) != base
    assert target_fingerprint(_checkpoint(tmp_path / "e", {"model.safetensors": {"w": big, "b": small}},
                                          tokenizer=b'{"model": {"vocab": {"b": 0}}}')) != base
    assert target_fingerprint(_checkpoint(tmp_path / "f", {"model.safetensors": {"w": big, "b": small}},
                                          config={"model_type": "llama", "hidden_size": 16})) != base
    assert target_fingerprint("HuggingFaceTB/SmolLM2-135M-Instruct") == "name:HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "g").mkdir()
    with pytest.raises(FingerprintError, match="config.json"):
        target_fingerprint(tmp_path / "g")


def test_where_the_cli_finds_one_server_or_a_fleet(tmp_path):
    from sglang_specopd.app.train.fleet_session import Endpoints, resolve_endpoints
    from sglang_specopd.app.fleet.state import FleetState, ProcessRecord, write_state
    from sglang_specopd.app.train.options import _TrainFail

    assert resolve_endpoints("http://s:1/", None, None, None) == Endpoints(server="http://s:1")
    ends = resolve_endpoints(None, "http://a:1, http://b:2/,http://a:1", "http://r:0", None)
    assert ends == Endpoints(workers=("http://a:1", "http://b:2"), router="http://r:0") and ends.is_fleet
    listed = lambda url, key: ["http://127.0.0.1:31/", "http://127.0.0.1:32"]  # noqa: E731
    assert resolve_endpoints(None, None, "http://r:0/", None, "k", list_workers=listed) == Endpoints(
        workers=("http://127.0.0.1:31", "http://127.0.0.1:32"), router="http://r:0")

    def unreachable(url, key):
        raise ValueError(f"the router at {url} does not answer: ConnectError")

    with pytest.raises(_TrainFail, match="cannot find the fleet's workers through --router: the router at http://r:0"):
        resolve_endpoints(None, None, "http://r:0", None, list_workers=unreachable)
    for args, needle in [((None, None, None, None), "name the server(s) once"),
                         (("http://s", "http://a", None, None), "got --server and --workers"),
                         (("http://s", None, "http://r", None), "--server is one server; a fleet.s router goes alone"),
                         ((None, "a:1", None, None), "bad option --workers: 'a:1' is not an http(s) URL"),
                         ((None, None, None, tmp_path / "none"), "no fleet in")]:
        with pytest.raises(_TrainFail, match=needle.replace("(", r"\(").replace(")", r"\)")):
            resolve_endpoints(*args)
    sup = ProcessRecord(role="supervisor", pid=1)
    workers = tuple(ProcessRecord(role="worker", index=i, pid=10 + i, url=f"http://127.0.0.1:{31 + i}")
                    for i in range(2))
    state = FleetState(status="starting", config="c", host="127.0.0.1", router_url="http://127.0.0.1:30",
                       supervisor=sup, workers=workers, started_at=0.0, updated_at=0.0)
    write_state(tmp_path, state)
    with pytest.raises(_TrainFail, match="is starting, not ready"):
        resolve_endpoints(None, None, None, tmp_path)
    write_state(tmp_path, state.model_copy(update={"status": "ready"}))
    assert resolve_endpoints(None, None, None, tmp_path) == Endpoints(
        workers=("http://127.0.0.1:31", "http://127.0.0.1:32"), router="http://127.0.0.1:30")


def test_specopd_adapt_refuses_a_fleet_serving_two_targets_in_one_line(monkeypatch):
    import specopd_trainer.fleet.client as fc
    from fakes.cli import one_error_line
    from fakes.cli import specopd_cli as cli

    real = fc.FleetClient

    def fake_fleet(workers, **kw):
        client = real(workers, client_factory=FakeWorker)
        client.workers["http://w1"].info["target"] = {"fingerprint": "sha256:" + "c" * 64, "dtype": "float32"}
        return client

    monkeypatch.setattr(fc, "FleetClient", fake_fleet)
    line = one_error_line(cli("adapt", "--workers", "http://w0,http://w1", "--admin-key", "k"), code=1)
    assert line == ("error: the workers do not serve the same model, so their answers cannot be mixed: the target "
                    "(fingerprint of its checkpoint) differs: sha256:aaaaaaaaaaaa... on http://w0; "
                    "sha256:cccccccccccc... on http://w1")
    line = one_error_line(cli("train", "sft", "--workers", "http://w0,http://w1", "--admin-key", "k"), code=1)
    assert "the target (fingerprint of its checkpoint) differs" in line


def test_each_worker_reports_the_target_it_serves(tmp_path):
    import torch

    from sglang_specopd.server import target_identity as ti
    from sglang_specopd.wire.target_fingerprint import target_fingerprint

    root = _checkpoint(tmp_path / "t", {"model.safetensors": {"w": torch.ones(4)}})
    sched = SimpleNamespace(server_args=SimpleNamespace(model_path=str(root), dtype="bfloat16"))
    assert ti.target_identity(sched) == {"fingerprint": target_fingerprint(root), "dtype": "bfloat16"}
    broken = SimpleNamespace(server_args=SimpleNamespace(model_path=str(tmp_path), dtype="auto"))
    assert ti.target_identity(broken)["fingerprint"].startswith("unreadable: cannot read")
