"""Rollout as a transaction on TWO real SPECOPD workers: conftest's shared ``tiny_admin_server`` and a second tiny
server started here (same target, drafter and admin key), driven by :class:`specopd_trainer.fleet.rollout.FleetRollout`
and the raw ``/specopd/drafter/stage|commit|abort`` routes. The update is the scaled copy of the start-up drafter
(same spec, other weights); every test leaves both workers with nothing staged.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from conftest import TINY_ADMIN_KEY, TINY_MAX_PAYLOAD, TINY_MAX_PAYLOAD_ENV, _env_var, running_server, tiny_launch_spec
from sglang_specopd.wire.rollout import ABORT_DRAFTER_PATH, COMMIT_DRAFTER_PATH, STAGE_DRAFTER_PATH
from specopd_trainer.fleet.rollout import FleetRollout
from specopd_trainer.fleet.worker import DrafterUpdate, WorkerAdmin

pytestmark = pytest.mark.server
ADMIN = {"Authorization": f"Bearer {TINY_ADMIN_KEY}"}
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def second_worker(tiny_admin_server, tiny_serving_target: Path, tiny_drafter: Path, tmp_path_factory):
    """A second SPECOPD worker like ``tiny_admin_server`` (no prefix cache, no spool), for this module only."""
    from sglang_specopd.app.launch.process import free_port

    spec = replace(tiny_launch_spec(tiny_serving_target, free_port(), tiny_drafter), admin_api_key=TINY_ADMIN_KEY)
    with contextlib.ExitStack() as stack:
        with _env_var(TINY_MAX_PAYLOAD_ENV, str(TINY_MAX_PAYLOAD)):
            srv = stack.enter_context(running_server(spec, tmp_path_factory.mktemp("logs"), "fleet-worker-2"))
        yield srv


@pytest.fixture(scope="module")
def fleet(tiny_admin_server, second_worker, tiny_drafter: Path, tmp_path_factory):
    """``(urls, update of the scaled drafter, update of the start-up drafter)``; both workers start on "initial"."""
    from support.score_trees import make_scaled_drafter

    scaled = make_scaled_drafter(tiny_drafter, tmp_path_factory.mktemp("fleet-scaled") / "scaled")
    urls = [tiny_admin_server.url, second_worker.url]
    assert [info(u)["version"] for u in urls] == ["initial", "initial"]
    yield urls, DrafterUpdate.from_path(scaled, "fleet-v1"), DrafterUpdate.from_path(tiny_drafter, "fleet-v0")
    for u in urls:  # nothing staged (after a failed test: abort what it left, then fail here)
        staged = info(u)["staged"]
        if staged:
            post_txn(u, ABORT_DRAFTER_PATH, staged["txn"])
        assert staged is None, (u, staged)


def info(url: str) -> dict:
    r = httpx.get(url + "/specopd/drafter", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def versions_of_a_response(url: str) -> list:
    r = httpx.post(url + "/generate", json={"text": PROMPT, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]["specopd_drafter_versions"]


def rollout(urls, **kw) -> FleetRollout:
    return FleetRollout(urls, admin_api_key=TINY_ADMIN_KEY, retries=0, backoff_s=0.1, ttl_s=60, **kw)


def test_stage_and_commit_on_both_then_rollback(fleet) -> None:
    urls, v1, v0 = fleet
    before = [info(u)["version"] for u in urls]  # "initial", or what another test of this module left
    with rollout(urls, probe_input_ids=[1, 2, 3, 4], initial=v0) as ro:
        report = ro.rollout(v1)
        assert report.ok, report
        assert [w.serving for w in report.workers] == ["fleet-v1", "fleet-v1"]
        assert [w.commit.reply["previous_version"] for w in report.workers] == before
        assert all(w.commit.reply["txn"] == report.txn for w in report.workers)
        assert all(w.verify.reply["probe_versions"] == ["fleet-v1"] for w in report.workers)
        for u in urls:
            assert info(u)["version"] == "fleet-v1" and info(u)["staged"] is None
            assert versions_of_a_response(u) == ["fleet-v1"]
        back = ro.rollback()
        assert back.ok and back.version == "fleet-v0"
        assert [versions_of_a_response(u) for u in urls] == [["fleet-v0"], ["fleet-v0"]]


class InvalidDrafterWorker(WorkerAdmin):
    """Sends a drafter whose config differs from the serving one (block size 8): the worker refuses it (400)."""

    def __init__(self, url: str, bad: DrafterUpdate):
        super().__init__(url, admin_api_key=TINY_ADMIN_KEY, retries=0)
        self.bad = bad

    def stage(self, txn, update, ttl_s):
        return super().stage(txn, self.bad, ttl_s)


def test_a_refused_stage_aborts_on_both(fleet, tiny_drafter: Path, tmp_path) -> None:
    urls, v1, _ = fleet
    bad_dir = tmp_path / "b8"
    bad_dir.mkdir()
    config = json.loads((tiny_drafter / "config.json").read_text())
    config["dflash_config"]["block_size"] = 8
    (bad_dir / "config.json").write_text(json.dumps(config))
    (bad_dir / "model.safetensors").symlink_to(tiny_drafter / "model.safetensors")
    bad = DrafterUpdate.from_path(bad_dir, "fleet-bad")
    before = [info(u)["version"] for u in urls]
    # The refusing worker is the one staged second (the lowest URL is staged first, alone: the fleet's lock), so
    # the good one has a staged copy to drop. Ports are random: which of the two is lower differs between runs.
    good, refusing = min(urls), max(urls)
    factory = {refusing: lambda u: InvalidDrafterWorker(u, bad)}
    with rollout(urls, worker_factory=lambda u: factory.get(u, lambda u: WorkerAdmin(
            u, admin_api_key=TINY_ADMIN_KEY, retries=0))(u)) as ro:
        report = ro.rollout(v1)
    by_url = {w.url: w for w in report.workers}
    assert not report.committed and by_url[good].stage.ok and by_url[refusing].stage.status == 400
    assert "block_size" in report.refused[0][1] and report.refused[0][0] == refusing
    assert by_url[good].abort.reply["aborted"] is True  # the good worker's staged copy was dropped
    assert [info(u)["version"] for u in urls] == before and all(info(u)["staged"] is None for u in urls)
    assert [w.serving for w in report.workers] == before


def stage(url: str, txn: str, update: DrafterUpdate, ttl_s: float = 60, headers=ADMIN) -> httpx.Response:
    return httpx.post(url + STAGE_DRAFTER_PATH, params={"txn": txn, "ttl_s": ttl_s}, content=update.body,
                      headers=headers, timeout=120)


def post_txn(url: str, path: str, body, headers=ADMIN) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps({"txn": body}).encode()
    return httpx.post(url + path, content=content, headers=headers, timeout=120)


def test_concurrent_rollouts_one_wins_the_other_gets_409(fleet) -> None:
    urls, v1, v0 = fleet
    before = [info(u)["version"] for u in urls]
    assert stage(urls[0], "trainer-a", v1).status_code == 200
    with rollout(urls) as ro:
        report = ro.rollout(v0)  # trainer B
    assert not report.committed and report.workers[0].stage.status == 409
    assert "transaction 'trainer-a' (version 'fleet-v1') is staged" in report.refused[0][1]
    assert info(urls[1])["staged"] is None  # B aborted its own stage on the second worker
    r = stage(urls[0], "trainer-c", v0)
    assert r.status_code == 409 and "'trainer-c' cannot proceed" in r.json()["error"]["message"]
    r = httpx.post(urls[0] + "/specopd/drafter/swap", content=v0.body, headers=ADMIN, timeout=60)
    assert r.status_code == 409 and "one-phase swap" in r.json()["error"]["message"]
    assert info(urls[0])["staged"]["txn"] == "trainer-a"  # A's stage survived B's abort
    r = post_txn(urls[0], ABORT_DRAFTER_PATH, "trainer-a")
    assert r.status_code == 200 and r.json()["aborted"] is True
    assert [info(u)["version"] for u in urls] == before and info(urls[0])["staged"] is None


def test_abort_and_expiry(fleet) -> None:
    urls, v1, _ = fleet
    before = info(urls[1])["version"]
    assert stage(urls[1], "to-abort", v1).status_code == 200
    assert post_txn(urls[1], ABORT_DRAFTER_PATH, "to-abort").json() == {
        "txn": "to-abort", "aborted": True, "version": before, "staged": None}
    r = post_txn(urls[1], COMMIT_DRAFTER_PATH, "to-abort")
    assert r.status_code == 409 and "it was aborted" in r.json()["error"]["message"]
    r = stage(urls[1], "to-expire", v1, ttl_s=1.0)
    assert r.status_code == 200 and r.json()["version"] == "fleet-v1" and r.json()["serving_version"] == before
    assert info(urls[1])["staged"]["txn"] == "to-expire"
    time.sleep(1.5)
    assert info(urls[1])["staged"] is None
    r = post_txn(urls[1], COMMIT_DRAFTER_PATH, "to-expire")
    assert r.status_code == 409 and "it was expired" in r.json()["error"]["message"]
    assert info(urls[1])["version"] == before


def test_missed_commit_is_reconciled(fleet) -> None:
    urls, v1, v0 = fleet
    target = "fleet-v1" if info(urls[0])["version"] != "fleet-v1" else "fleet-v0"
    update = v1 if target == "fleet-v1" else v0

    class DownAtCommit(WorkerAdmin):
        def commit(self, txn):
            return WorkerAdmin("http://127.0.0.1:9", admin_api_key=TINY_ADMIN_KEY, retries=0).commit(txn)

    make = {urls[1]: DownAtCommit}
    with rollout(urls, worker_factory=lambda u: make.get(u, WorkerAdmin)(
            u, admin_api_key=TINY_ADMIN_KEY, retries=0)) as ro:
        report = ro.rollout(update)
        assert report.committed and report.missed == (urls[1],) and report.workers[1].commit.status is None
        assert info(urls[1])["staged"]["txn"] == report.txn  # it still holds the staged copy
        ro.workers[urls[1]] = WorkerAdmin(urls[1], admin_api_key=TINY_ADMIN_KEY, retries=0)  # back up
        out = ro.reconcile()
    assert [o.serving for o in out] == [target, target] and out[1].commit.reply["txn"] == report.txn
    assert [versions_of_a_response(u) for u in urls] == [[target], [target]]


def test_bad_requests_are_4xx(fleet) -> None:
    url, v1 = fleet[0][1], fleet[1]
    cases = [
        (stage(url, "t", v1, headers={}), 401, None),
        (httpx.post(url + STAGE_DRAFTER_PATH, content=v1.body, headers=ADMIN, timeout=60), 400, "missing query"),
        (stage(url, "bad id!", v1), 400, "txn must be"),
        (stage(url, "t", v1, ttl_s=1e9), 400, "ttl_s must be in"),
        (httpx.post(url + STAGE_DRAFTER_PATH, params={"txn": "t"}, content=b"{[", headers=ADMIN, timeout=60), 400,
         "refused"),
        (httpx.post(url + STAGE_DRAFTER_PATH, params={"txn": "t"}, content=b"\x00" * 16, headers=ADMIN, timeout=60),
         400, None),
        (post_txn(url, COMMIT_DRAFTER_PATH, b'{"txn": "t", "x": 1}'), 400, "Extra inputs"),
        (post_txn(url, ABORT_DRAFTER_PATH, b"[" * 5000), 413, None),
        (post_txn(url, COMMIT_DRAFTER_PATH, "never-staged"), 409, "never staged here"),
    ]
    for r, status, reason in cases:
        assert r.status_code == status, (r.request.url, r.status_code, r.text[:300])
        if reason:
            assert reason in r.json()["error"]["message"], r.text[:300]
    assert info(url)["staged"] is None
