"""``specopd adapt`` against a real tiny-target SPECOPD server (fp32) with the traffic spool and feature capture on:
the features captured while serving equal score_trees' (also after a radix-cached prefix), traffic in, candidates
judged, a push or a refusal the server agrees with, a resume after ``kill -9``, and a corrupted spool item skipped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

ADMIN = "adapt-admin"
pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def adapt_server(tiny_serving_target, tiny_drafter, tmp_path_factory):
    from conftest import running_server, tiny_launch_spec
    from sglang_specopd.app.launch.process import free_port

    spec = replace(tiny_launch_spec(tiny_serving_target, free_port(), tiny_drafter), admin_api_key=ADMIN,
                   traffic_spool_mb=4, traffic_features_mb=8)
    with running_server(spec, tmp_path_factory.mktemp("logs"), "adapt") as srv:
        yield srv


def _send(url, prompts, max_new_tokens=24):
    import httpx

    for p in prompts:
        r = httpx.post(url + "/generate", json={"input_ids": p, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0}}, timeout=120)
        assert r.status_code == 200, r.text[:200]


def _prompts(n, seed=0, length=12, shared=()):
    import random

    rng = random.Random(seed)
    return [list(shared) + [rng.randrange(10, 900) for _ in range(length)] for _ in range(n)]


def test_features_captured_while_serving_equal_score_trees_features(adapt_server):
    import torch

    from specopd_trainer.client.http import SpecOPDClient

    url = adapt_server.url
    cfg = json.loads((Path(adapt_server.spec.drafter_path) / "config.json").read_text())
    layer_ids = list(cfg["dflash_config"]["target_layer_ids"])
    shared = list(range(20, 52))  # 32 tokens the radix cache keeps after the first request
    with SpecOPDClient(url, admin_api_key=ADMIN) as c:
        before = c.traffic_page(0, None, 1)["stats"]["newest_seq"] or 0  # what other tests recorded first
        _send(url, _prompts(1, seed=1, shared=shared) + _prompts(2, seed=2, shared=shared) + _prompts(1, seed=3))
        page = c.traffic_page(before, None, 64)
        items = page["items"]
        assert len(items) == 4, [it["seq"] for it in items]
        got, missing = c.traffic_features([it["seq"] for it in items], page["spool_id"])
        assert missing == [] and set(got) == {it["seq"] for it in items}
        starts = []
        for it in items:
            start, rows = got[it["seq"]]
            n = len(it["input_ids"])
            assert it["features"] == {"start": start, "rows": n - 1 - start} and rows.shape[0] == n - 1 - start
            ref = c.context_features(it["input_ids"], layer_ids, dtype="float32")
            assert torch.allclose(rows.float(), ref[start:n - 1], atol=2e-2, rtol=1e-2)  # bf16 storage
            starts.append(start)
        assert starts[0] == 0 and starts[1] >= 32 and starts[2] >= 32  # the shared prefix was not recomputed
        with pytest.raises(Exception, match="409"):
            c.traffic_features([items[0]["seq"]], "another-spool")


def _adapt_cmd(url, run_dir, summary, steps):
    return [sys.executable, "-m", "sglang_specopd.app.cli", "adapt", "--server", url, "--admin-key", ADMIN,
            "--run-dir", str(run_dir), "--max-steps", str(steps), "--min-holdout", "4", "--holdout-every", "3",
            "--eval-every", "10", "--min-train-tokens", "32", "--ckpt-every", "5", "--poll-s", "0.2",
            "--no-progress", "--summary-json", str(summary), "--set", "seqs_per_step=2", "--set", "anchors_per_seq=8"]


# Adapter steps in the kill -9 test: checkpoints every 5, evaluations every 10, so a kill after the first checkpoint
# and two judged candidates; each step waits for served traffic, so the test's time is about STEPS requests served
# one at a time (57-272 s for 40 steps on a 2-core AVX2 EPYC with the other xdist worker busy).
STEPS = 20


def test_adapt_cli_resumes_after_kill9_and_the_server_serves_what_it_deployed(adapt_server, tmp_path):
    import threading

    import httpx

    url, run_dir, summary = adapt_server.url, tmp_path / "run", tmp_path / "summary.json"
    stop = threading.Event()

    def traffic():
        i = 0
        while not stop.is_set():
            _send(url, _prompts(1, seed=100 + i, length=10), max_new_tokens=20)
            i += 1

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.Popen(_adapt_cmd(url, run_dir, summary, STEPS), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "latest").is_file():
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert 5 <= _latest_step(run_dir) < STEPS
        done = subprocess.run(_adapt_cmd(url, run_dir, summary, STEPS), env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    finally:
        stop.set()
        sender.join(120)
        with contextlib.suppress(Exception):
            os.killpg(proc.pid, signal.SIGKILL)
    out = json.loads(summary.read_text())
    assert out["stopped_by"] == "max_steps" and out["step"] == STEPS
    # the only items skipped are replies the tiny target ended after one token (nothing to train on)
    assert out["reader"]["items"] > 0 and set(out["reader"]["bad_items"]) <= {"no_response"}
    assert out["train_items"] > 0
    assert out["features"]["served"] > 0 and out["traffic_tokens_seen"] > 0
    assert out["buffers"]["train"]["duplicates"] + out["buffers"]["holdout"]["duplicates"] >= 0
    assert any(v["kind"] == "candidate" for v in out["verdicts"])
    serving = httpx.get(url + "/specopd/drafter", timeout=30).json()["version"]
    assert serving == out["deployed_version"]  # a push the server took, or none: it still serves "initial"
    assert out["deployed"][0]["version"] == "initial"
    assert (run_dir / "drafter-deployed" / "model.safetensors").is_file()
    if out["pushes"]:  # put the server back for the next test
        _swap_back(adapt_server)


def _latest_step(run_dir: Path) -> int:
    name = (run_dir / "checkpoints" / "latest").read_text().strip()
    return int(name.split("-")[1].split(".")[0])


def _swap_back(srv):
    import httpx

    r = httpx.post(srv.url + "/specopd/drafter/swap", json={"path": srv.spec.drafter_path, "version": "initial"},
                   headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120)
    assert r.status_code == 200, r.text[:300]


def test_a_corrupted_spool_item_is_counted_and_skipped(adapt_server, tmp_path):
    """The real server's pages, with one item per page damaged on the way (truncated ids), read by the adapter."""
    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.adapt.loop import Adapter
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.registry import drafter_class_for_checkpoint

    class Damaging(SpecOPDClient):
        def traffic_page(self, after, spool_id, max_items):
            page = super().traffic_page(after, spool_id, max_items)
            if page.get("items"):
                page["items"][0]["input_ids"] = page["items"][0]["input_ids"][:1]  # prompt_len beyond the ids
            return page

    _send(adapt_server.url, _prompts(8, seed=7, length=10), max_new_tokens=20)
    drafter_dir, target = Path(adapt_server.spec.drafter_path), Path(adapt_server.spec.model_path)
    drafter = drafter_class_for_checkpoint(drafter_dir).from_pretrained(drafter_dir, target)
    with Damaging(adapt_server.url, admin_api_key=ADMIN) as client:
        cfg = AdaptConfig(max_steps=3, min_train_tokens=8, min_holdout=100, poll_s=0.1, read_items=4,
                          algorithm_options={"seqs_per_step": 2, "anchors_per_seq": 4})
        ad = Adapter(client, drafter, tmp_path / "run", cfg, push=lambda d, v: None,
                     serving_version=lambda: "initial", progress=False)
        out = ad.run()
    assert out["step"] == 3 and out["reader"]["bad_items"].get("truncated", 0) >= 2
    assert out["reader"]["items"] >= 6 and out["train_items"] > 0


def test_a_request_can_opt_out_of_the_spool(adapt_server):
    """``custom_params: {"specopd_spool": false}`` (what held-out measurements send) is served but never kept;
    another value of that key is a 400 with the reason."""
    import httpx

    from specopd_trainer.client.http import SpecOPDClient

    url = adapt_server.url
    with SpecOPDClient(url, admin_api_key=ADMIN) as c:
        newest = c.traffic_page(0, None, 1)["stats"]["newest_seq"]
        body = {"input_ids": _prompts(1, seed=11)[0], "sampling_params": {
            "max_new_tokens": 8, "temperature": 0, "custom_params": {"specopd_spool": False}}}
        r = httpx.post(url + "/generate", json=body, timeout=120)
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] >= 1
        assert c.traffic_page(0, None, 1)["stats"]["newest_seq"] == newest  # served, not kept
        _send(url, _prompts(1, seed=12), max_new_tokens=8)
        assert c.traffic_page(0, None, 1)["stats"]["newest_seq"] == newest + 1
    body["sampling_params"]["custom_params"] = {"specopd_spool": "no"}
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 400 and "specopd_spool must be true or false" in r.text


def _opd_adapter(adapt_server, tiny_serving_target, run_dir, algorithm, options):
    """An in-process adapter of ``algorithm`` on the server's spool (oldest first), pushes not sent, target rows
    scored for it counted (``client.scored``)."""
    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.adapt.loop import Adapter
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.registry import drafter_class_for_checkpoint

    path = adapt_server.spec.drafter_path
    drafter = drafter_class_for_checkpoint(path).from_pretrained(path, tiny_serving_target)
    client = SpecOPDClient(adapt_server.url, admin_api_key=ADMIN)
    client.scored = 0
    inner = client.score_trees

    def score_trees(req):
        out = inner(req)
        client.scored += sum(int(r.num_nodes) for r in out)
        return out

    client.score_trees = score_trees
    cfg = AdaptConfig(algorithm=algorithm, algorithm_options=options, max_steps=3, eval_every=1000,
                      min_train_tokens=16, min_holdout=2, holdout_every=1000, poll_s=0.2, rehearsal=0.25,
                      log_every_s=5.0, max_minutes=4.0)  # ~nothing held out (no judging here); never waits forever
    ad = Adapter(client, drafter, run_dir, cfg, push=lambda d, v: None,
                 serving_version=lambda: client.drafter_info().get("version"), progress=True)
    return ad, client


def _trained_on_the_server(ad, client, start):
    import torch

    out = ad.run()
    assert out["stopped_by"] == "max_steps" and out["step"] == 3
    assert out["trained_tokens"] > 0 and client.scored > 0  # the live target scored the drafts it learned from
    assert any(not torch.equal(p, start[k]) for k, p in ad.drafter.state_dict().items())
    return out


def test_the_specopd_adapt_step_trains_on_served_traffic(adapt_server, tiny_serving_target, tmp_path):
    import copy

    _send(adapt_server.url, _prompts(6, seed=300, length=10), max_new_tokens=24)
    ad, client = _opd_adapter(adapt_server, tiny_serving_target, tmp_path / "run", "specopd",
                              {"seqs_per_step": 1, "anchors_per_seq": 2, "branches": 2, "loss": "e2e_fkl_is",
                               "temperature": 1.0})
    _trained_on_the_server(ad, client, copy.deepcopy(ad.drafter.state_dict()))


def test_the_draft_opd_adapt_step_replays_the_served_verify_records(adapt_server, tiny_serving_target, tmp_path):
    import copy

    _send(adapt_server.url, _prompts(6, seed=400, length=10), max_new_tokens=24)
    ad, client = _opd_adapter(adapt_server, tiny_serving_target, tmp_path / "run", "draft-opd",
                              {"rejected_slots": "first", "rollout_prompts": 4, "max_blocks": 8})
    serving = client.drafter_info().get("version")
    assert ad.fresh_versions() == {serving}  # only records the serving drafter made are replayed
    _trained_on_the_server(ad, client, copy.deepcopy(ad.drafter.state_dict()))


def test_k0_steps_run_as_plain_decode_only_for_requests_kept_out_of_the_spool(adapt_server):
    """Feature capture on: a batch of requests sent with ``specopd_spool: false`` takes the plain-decode path at
    k = 0 (no features to capture for them, none kept), a spooled request takes the verify path and keeps its
    features (issue 53: the main job measures plain speed on this kind of server)."""
    import httpx

    from specopd_trainer.client.http import SpecOPDClient
    from sglang_specopd.wire.policy import POLICY_PATH

    url, headers = adapt_server.url, {"Authorization": f"Bearer {ADMIN}"}
    gamma = httpx.get(url + POLICY_PATH, timeout=60).json()["gamma"]
    k0 = {"policy": "goodput", "explore_every": 0, "cost_curve_ms": {1: [1.0] + [100.0] * gamma}}
    assert httpx.post(url + POLICY_PATH, json=k0, headers=headers, timeout=60).status_code == 200
    try:
        def stats():
            return httpx.get(url + POLICY_PATH, timeout=60).json()

        with SpecOPDClient(url, admin_api_key=ADMIN) as c:
            newest = c.traffic_page(0, None, 1)["stats"]["newest_seq"] or 0
            s0 = stats()
            for p in _prompts(2, seed=7):
                r = httpx.post(url + "/generate", json={"input_ids": p, "sampling_params": {
                    "max_new_tokens": 12, "temperature": 0, "custom_params": {"specopd_spool": False}}}, timeout=120)
                assert r.status_code == 200, r.text[:200]
            s1 = stats()
            assert s1["plain_steps"] - s0["plain_steps"] >= 2 * 10, (s0, s1)  # every decode step but the first
            _send(url, _prompts(1, seed=8), max_new_tokens=12)
            s2 = stats()
            assert s2["plain_steps"] == s1["plain_steps"] and s2["steps"] > s1["steps"], (s1, s2)
            page = c.traffic_page(newest, None, 64)
            assert len(page["items"]) == 1 and page["items"][0]["features"]["rows"] > 0, page["items"]
    finally:
        assert httpx.post(url + POLICY_PATH, json={"policy": "fixed"}, headers=headers, timeout=60).status_code == 200


def test_the_guard_refuses_a_candidate_made_worse_on_one_slice_of_real_traffic(adapt_server, tmp_path):
    """Issue 51: real traffic in two slices (prompts that start alike after a shared header) goes through the
    server's spool and feature capture into the adapter's buffers (hash hold-out, slices keyed by the prompt's first
    tokens); a candidate made worse on purpose on the older slice A (its proposals off by one there) and better on
    the newer slice B (it proposes the served continuation there) measures better overall on the newest held-out
    window, yet the per-slice check refuses it, naming slice A, and nothing is pushed."""
    import httpx
    import torch

    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.adapt.loop import Adapter
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.registry import drafter_class_for_checkpoint

    header, pre_a, pre_b = [1, 2], [31, 32, 33, 34], [41, 42, 43, 44]
    drafter_dir, target = Path(adapt_server.spec.drafter_path), Path(adapt_server.spec.model_path)
    drafter = drafter_class_for_checkpoint(drafter_dir).from_pretrained(drafter_dir, target)
    serving = httpx.get(adapt_server.url + "/specopd/drafter", timeout=30).json()["version"]
    pushed = []
    with SpecOPDClient(adapt_server.url, admin_api_key=ADMIN) as client:
        cfg = AdaptConfig(start_at="newest", slice_header=tuple(header), slice_min_seen=1, holdout_every=2,
                          holdout_window=6, min_holdout=4, guard_min_slice_items=4, min_train_tokens=8,
                          poll_s=0.1, read_items=16)
        ad = Adapter(client, drafter, tmp_path / "run", cfg, push=lambda d, v: pushed.append(v),
                     serving_version=lambda: serving, progress=False)
        _send(adapt_server.url, _prompts(20, seed=51, length=8, shared=header + pre_a), max_new_tokens=24)  # older
        _send(adapt_server.url, _prompts(20, seed=52, length=8, shared=header + pre_b), max_new_tokens=24)  # newer
        deadline, quiet = time.monotonic() + 120, 0
        while quiet < 3:  # the spool holds all 40 (sent one by one); read until three reads add nothing
            assert time.monotonic() < deadline, (len(ad.train_buf), len(ad.hold_buf), ad.state.reader)
            quiet = 0 if ad.ingest() else quiet + 1
            time.sleep(0.2)
        assert len(ad.train_buf) + len(ad.hold_buf) >= 36, ad.state.reader  # a reply ended after 1 token is skipped
        hold = ad.hold_buf.sequences
        slice_of = {tuple(s.token_ids[2:6].tolist()): s.slice for s in hold}
        sl_a, sl_b = slice_of[tuple(pre_a)], slice_of[tuple(pre_b)]
        assert sl_a != sl_b and "other" not in (sl_a, sl_b)
        assert {s.slice for s in hold} == {sl_a, sl_b} and all(s.slice == sl_b for s in hold[-6:])
        assert all(s.token_ids[2:6].tolist() != pre_a for s in ad.train_buf.sequences if s.slice == sl_b)

        block = int(drafter.spec.block_size)
        honest = ad.drafter.propose_blocks

        def rigged(features, token_ids, anchors):
            ids = token_ids.tolist()
            if ids[2:6] == pre_a:  # worse on slice A on purpose: every proposal off by one
                return honest(features, token_ids, anchors) + 1
            return torch.tensor([[ids[a + k] if a + k < len(ids) else 0 for k in range(1, block)]  # slice B: the
                                 for a in anchors], dtype=torch.long)                               # served tokens

        ad.drafter.propose_blocks = rigged
        v = ad.judge()
    assert v["ran"] and v["ci95"][0] > 0, v  # better overall on the newest held-out window (slice B)
    a, b = v["slices"][sl_a], v["slices"][sl_b]
    assert a["ran"] and a["items"] >= 4 and a["diff"] < 0 and a["passed"] is False, a  # the deployed drafter
    assert b["ran"] and b["passed"] is True and b["diff"] > 0, b                        # accepts drafts on A
    assert v["slices_vs_start"][sl_a]["passed"] is False
    assert v["deploy"] is False and pushed == [] and "pushed" not in v
    assert f"worse on slice {sl_a} than the deployed drafter" in v["reason"] and sl_b not in v["reason"]
    assert httpx.get(adapt_server.url + "/specopd/drafter", timeout=30).json()["version"] == serving
