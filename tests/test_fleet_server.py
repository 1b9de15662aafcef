"""``specopd fleet`` on real workers: two tiny SPECOPD workers (the suite's tiny target and block-4 drafter, fp32,
each pinned to its own core) behind sglang-router, started with the console script (``--detach``), as a user would.

Checked: ``/generate`` and ``/v1/chat/completions`` through the router answer with the SPECOPD ``meta_info`` and
reach both workers (round robin); ``fleet status`` shows both healthy on one drafter version with their spools; a
:class:`~specopd_trainer.fleet.rollout.FleetRollout` over the workers moves both to a new version, which status and
the router's responses show; ``specopd adapt --fleet-run-dir`` reads both workers' spools with a cursor each,
resumes them, and puts its drafter back on both workers with one rollout; ``fleet stop`` leaves no process (pids,
the environment tag) and none of the workers' ``/dev/shm`` files, sockets or TMPDIRs, and a second stop changes
nothing. One fleet for the whole module.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import List

import httpx
import pytest
import yaml

from conftest import TEST_TAG_ENV, assert_no_leftover_files, assert_no_orphans, new_process_tag, server_files
from sglang_specopd.app.fleet.state import group_pids, read_state
from sglang_specopd.app.launch.process import PortInUseError, check_port_free, free_port
from specopd_trainer.fleet.rollout import FleetRollout
from specopd_trainer.fleet.worker import DrafterUpdate
from support.serving import specopd_exe

pytestmark = pytest.mark.server
ADMIN = "fleet-admin"
PROMPT = "def add(a, b):"
N_WORKERS = 2


def consecutive_free_ports(n: int) -> int:
    for _ in range(100):
        base = free_port()
        try:
            for i in range(n):
                check_port_free("127.0.0.1", base + i)
        except PortInUseError:
            continue
        if base + n <= 65535:
            return base
    raise AssertionError(f"no {n} consecutive free ports")


def fleet_cli(fleet, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess:
    return subprocess.run([specopd_exe(), "fleet", *args, "--run-dir", str(fleet["run_dir"])], env=fleet["env"],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def status(fleet) -> dict:
    res = fleet_cli(fleet, "status", "--json", timeout=60)
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def fleet(tiny_serving_target: Path, tiny_drafter: Path, tmp_path_factory):
    """Two workers and the router, started by ``specopd fleet start --detach``; stopped at the end (again, if the
    stop test did not run), with the orphan and leftover-file checks of the suite's own servers."""
    tmp = tmp_path_factory.mktemp("fleet")
    config = tmp / "tiny-fleet.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tiny-fleet", "target": str(tiny_serving_target), "drafter": str(tiny_drafter),
        "speculative_algorithm": "SPECOPD", "block_size": 4, "device": "cpu", "dtype": "float32",
        "attention_backend": "torch_native", "max_total_tokens": 4096, "disable_cuda_graph": True,
        "disable_overlap_schedule": True, "sleep_on_idle": True, "traffic_spool_mb": 1, "traffic_features_mb": 2}))
    tag = new_process_tag()
    env = {**os.environ, TEST_TAG_ENV: tag, "SPECOPD_ADMIN_KEY": ADMIN}
    fl = {"run_dir": tmp / "run", "env": env, "tag": tag, "config": config}
    port, base = free_port(), consecutive_free_ports(N_WORKERS)
    t0 = time.monotonic()
    res = fleet_cli(fl, "start", "--config", str(config), "--workers", str(N_WORKERS), "--port", str(port),
                    "--worker-base-port", str(base), "--pin-cores", "--policy", "round_robin", "--detach",
                    "--timeout", "420", timeout=1000)
    fl["start_s"] = time.monotonic() - t0
    state = read_state(fl["run_dir"])
    try:
        assert res.returncode == 0, res.stdout + res.stderr + (fl["run_dir"] / "fleet.log").read_text()[-3000:]
        assert res.stdout.startswith(f"ready: router http://127.0.0.1:{port} -> 2 workers")
        fl.update(state=state, files=[server_files(w.pid) for w in state.workers])
        yield fl
    finally:
        if state is not None and read_state(fl["run_dir"]).status != "stopped":
            fleet_cli(fl, "stop")
        pids = [] if state is None else [r.pid for r in (state.supervisor, state.router, *state.workers) if r]
        assert_no_orphans(tag=tag)
        assert not [p for p in pids if Path(f"/proc/{p}").exists() and _not_zombie(p)], pids
        for files in fl.get("files", []):
            assert_no_leftover_files(files)


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def generate(url: str, n: int = 8) -> dict:
    r = httpx.post(url + "/generate", json={"text": PROMPT, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_started_pinned_workers_and_the_router(fleet) -> None:
    state = fleet["state"]
    assert state.status == "ready" and len(state.workers) == N_WORKERS and state.router is not None
    print(f"fleet of {N_WORKERS} tiny workers ready in {fleet['start_s']:.1f} s")
    cores: List[set] = []
    for w in state.workers:
        assert w.cores, w
        pids = group_pids(w)
        assert len(pids) >= 3, pids  # launcher, scheduler, detokenizer
        assert all(os.sched_getaffinity(p) == set(w.cores) for p in pids)
        cores.append(set(w.cores))
    available = os.sched_getaffinity(0)
    assert cores[0] != cores[1] or len(available) < N_WORKERS


def test_generate_and_chat_through_the_router(fleet) -> None:
    url = fleet["state"].router_url
    versions = [generate(url)["meta_info"] for _ in range(2 * N_WORKERS)]
    for meta in versions:
        assert meta["specopd_drafter_versions"] == ["initial"] and meta["spec_verify_ct"] >= 1
        assert "spec_accept_length" in meta
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    chat = {"model": model, "messages": [{"role": "user", "content": "Hello world"}], "max_tokens": 8,
            "temperature": 0, "ignore_eos": True, "return_meta_info": True}
    r = httpx.post(url + "/v1/chat/completions", json=chat, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8 and r.json()["choices"][0]["message"]["content"]
    # sglang-router 0.3.2 re-encodes the request and drops SGLang's return_meta_info (and custom_params): the reply
    # has no meta_info through the router (docs/fleet.md); a worker asked directly returns it
    assert "meta_info" not in r.json()["choices"][0]
    direct = httpx.post(fleet["state"].worker_urls[0] + "/v1/chat/completions", json=chat, timeout=120)
    assert direct.json()["choices"][0]["meta_info"]["specopd_drafter_versions"] == ["initial"]
    # the plugin's own routes are the workers' business: the router does not forward them
    assert httpx.get(url + "/specopd/drafter", timeout=30).status_code == 404
    # ... but it lists its workers, which is how `specopd train --router URL` alone finds them
    from sglang_specopd.app.fleet.router import router_workers

    assert sorted(router_workers(url)) == sorted(fleet["state"].worker_urls)


def test_the_benchmark_client_streams_through_the_router_on_generate(fleet) -> None:
    from sglang_specopd.app.bench.client import BenchPrompt, RequestParams, run_level

    url = fleet["state"].router_url
    prompts = [BenchPrompt(f"p{i}", "dialogue", tuple(range(20, 30 + i))) for i in range(2)]
    run = run_level(url, prompts, 2, RequestParams(max_new_tokens=6, ignore_eos=True), timeout_s=120, api="generate")
    for rec in run.records:
        assert rec.ok and rec.completion_tokens == 6 and sum(rec.chunk_tokens) == 6, rec
        assert rec.verify_ct >= 1 and rec.finish_reason == "length" and rec.prompt_tokens == len(prompts[0].prompt_ids) \
            + (rec.id == "p1")
    # the router's /v1/completions takes no token-id prompt (docs/fleet.md): the OpenAI-route client cannot use it
    bad = run_level(url, prompts[:1], 1, RequestParams(max_new_tokens=4), timeout_s=60)
    assert not bad.records[0].ok and "HTTP 4" in bad.records[0].error


def test_status_shows_both_workers_healthy_on_one_version_with_their_spools(fleet) -> None:
    st = status(fleet)
    assert st["ok"] and st["status"] == "ready" and st["drafter_versions"] == ["initial"], st
    assert st["router"]["readiness"]["healthy_workers"] == N_WORKERS
    for w in st["workers"]:
        assert w["healthy"] and w["running"] and w["drafter"]["version"] == "initial"
        assert w["spool"]["state"] == "on" and w["spool"]["recorded"] >= 2, w  # round robin: each served some
    text = fleet_cli(fleet, "status")
    assert text.returncode == 0 and text.stdout.rstrip().endswith("ok: every worker healthy, one drafter version")


def recorded(fleet) -> List[int]:
    return [w["spool"]["recorded"] for w in status(fleet)["workers"]]


def test_the_spool_opt_out_passes_the_router_on_completions_only(fleet) -> None:
    url, before = fleet["state"].router_url, recorded(fleet)
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    for _ in range(N_WORKERS):  # round robin: one request per worker
        r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 4,
                                                      "custom_params": {"specopd_spool": False}}, timeout=120)
        assert r.status_code == 200, r.text
    assert recorded(fleet) == before
    for _ in range(N_WORKERS):  # /generate loses custom_params in the router (docs/fleet.md): recorded anyway
        r = httpx.post(url + "/generate", json={"text": PROMPT, "sampling_params": {
            "max_new_tokens": 4, "custom_params": {"specopd_spool": False}}}, timeout=120)
        assert r.status_code == 200, r.text
    assert recorded(fleet) == [n + 1 for n in before]


def test_a_fleet_rollout_moves_both_workers(fleet, tiny_drafter: Path, tmp_path) -> None:
    from support.score_trees import make_scaled_drafter

    scaled = make_scaled_drafter(tiny_drafter, tmp_path / "scaled")
    urls = fleet["state"].worker_urls
    with FleetRollout(urls, admin_api_key=ADMIN, retries=0, ttl_s=60, probe_input_ids=[1, 2, 3, 4],
                      initial=DrafterUpdate.from_path(tiny_drafter, "fleet-v0")) as ro:
        report = ro.rollout(DrafterUpdate.from_path(scaled, "fleet-v1"))
    assert report.ok, report
    st = status(fleet)
    assert st["ok"] and st["drafter_versions"] == ["fleet-v1"], st
    url = fleet["state"].router_url
    assert [generate(url)["meta_info"]["specopd_drafter_versions"] for _ in range(N_WORKERS)] == [["fleet-v1"]] * 2


def adapt(fleet, run_dir: Path, steps: int) -> dict:
    """``specopd adapt --fleet-run-dir`` (the workers and the router from fleet.json) for ``steps`` steps."""
    summary = run_dir.parent / f"summary-{steps}.json"
    res = subprocess.run([specopd_exe(), "adapt", "--fleet-run-dir", str(fleet["run_dir"]), "--run-dir", str(run_dir),
                          "--max-steps", str(steps), "--holdout-every", "3", "--min-train-tokens", "32",
                          "--ckpt-every", "1", "--poll-s", "0.2", "--no-progress", "--summary-json", str(summary),
                          "--set", "seqs_per_step=2", "--set", "anchors_per_seq=8"], env=fleet["env"],
                         capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return json.loads(summary.read_text())


def test_adapt_reads_both_spools_and_pushes_to_the_fleet_as_one_transaction(fleet, tiny_drafter: Path,
                                                                           tmp_path) -> None:
    """Traffic through the router reaches both spools; ``specopd adapt --fleet-run-dir`` trains on both with a
    cursor per worker; the fleet is moved under it; the resumed run reads on from both cursors and, finding the
    fleet on another version, puts its deployed drafter back with one FleetRollout: committed on both workers."""
    state, router = fleet["state"], fleet["state"].router_url
    urls = state.worker_urls
    for i in range(12):  # round robin: 6 requests per worker, recorded in its spool with captured features
        body = {"input_ids": [10 + i, 20 + 2 * i, 30, 40 + i, 7, 8],
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True}}
        r = httpx.post(router + "/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
    t0 = time.monotonic()
    first = adapt(fleet, tmp_path / "run", 2)
    serving = first["deployed"][0]["version"]
    assert first["step"] == 2 and first["pushes"] == 0
    by_worker = first["reader"]["by_worker"]
    assert set(by_worker) == set(urls) and all(n >= 6 for n in by_worker.values()), by_worker
    assert set(first["cursors"]) == set(urls) and first["features"]["served"] >= 12
    with FleetRollout(urls, admin_api_key=ADMIN, retries=0, ttl_s=60) as ro:  # someone moves the fleet
        assert ro.rollout(DrafterUpdate.from_path(tiny_drafter, "fleet-v2")).ok
    for i in range(2):  # one more request per worker, after the first run's cursors
        generate(router)
    second = adapt(fleet, tmp_path / "run", 4)
    print(f"two adapt runs against the fleet in {time.monotonic() - t0:.1f} s")
    assert second["step"] == 4 and second["deployed"][-1]["version"] == f"{serving}-restored"
    assert second["deployed"][-1]["why"] == "restored: the server served 'fleet-v2'"
    assert {u: c["after"] for u, c in second["cursors"].items()} == {
        u: c["after"] + 1 for u, c in first["cursors"].items()}  # each worker's cursor went on by its one request
    assert second["reader"]["items"] == first["reader"]["items"] + 2
    assert second["buffers"]["train"]["duplicates"] == second["buffers"]["holdout"]["duplicates"] == 0
    st = status(fleet)
    assert st["drafter_versions"] == [f"{serving}-restored"], st  # committed on both workers


def test_stop_leaves_nothing_and_a_second_stop_changes_nothing(fleet) -> None:
    state = fleet["state"]
    t0 = time.monotonic()
    res = fleet_cli(fleet, "stop")
    print(f"fleet stopped in {time.monotonic() - t0:.1f} s")
    assert res.returncode == 0 and res.stdout.splitlines() == [f"supervisor pid {state.supervisor.pid}: stopped"], \
        res.stdout + res.stderr
    assert_no_orphans(tag=fleet["tag"])
    for rec in (state.router, *state.workers):
        assert group_pids(rec) == [], rec
    for files in fleet["files"]:
        assert_no_leftover_files(files)
    assert read_state(fleet["run_dir"]).status == "stopped"
    again = fleet_cli(fleet, "stop")
    assert again.returncode == 0 and again.stdout.strip() == f"fleet in {fleet['run_dir']} already stopped"
    after = fleet_cli(fleet, "status", "--json")
    assert after.returncode == 1 and not json.loads(after.stdout)["ok"]
