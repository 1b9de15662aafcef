"""The plugin's Prometheus collectors (no server): counters move after recorded events, recording off records
nothing, SGLang's multiprocess mode aggregates them, the adapter's endpoint, the deploy/ files parse and name only
series that exist. The scrape of a real server is in tests/test_traffic_server.py (``--enable-metrics``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_specopd.server.metrics import hooks, recorder
from sglang_specopd.server.metrics.series import ADAPTER_SERIES, ALL_SERIES, SERVER_SERIES, by_name, exposed

REPO = Path(__file__).resolve().parents[1]
M = {"model_name": "tiny"}


@pytest.fixture
def registry():
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    recorder.configure(enabled=True, model_name="tiny", registry=reg)
    yield reg
    recorder.configure(enabled=False)


def value(reg, name, **labels):
    return reg.get_sample_value(name, {**M, **{k: str(v) for k, v in labels.items()}})


def test_verify_steps_move_the_spec_decode_counters(registry) -> None:
    recorder.touch("scheduler")
    assert value(registry, "specopd:spec_decode_num_drafts_total") == 0.0  # present before the first step
    recorder.record_verify([3, 0, 1], 3)  # three requests, block of 3 drafts each
    recorder.record_verify([2], [2])  # a goodput step verifying k = 2
    recorder.record_verify([0], [0])  # k = 0: nothing verified, nothing counted
    assert value(registry, "specopd:spec_decode_num_drafts_total") == 4
    assert value(registry, "specopd:spec_decode_num_draft_tokens_total") == 11
    assert value(registry, "specopd:spec_decode_num_accepted_tokens_total") == 6
    per_pos = [value(registry, "specopd:spec_decode_num_accepted_tokens_per_pos_total", position=p) for p in (1, 2, 3)]
    assert per_pos == [3, 2, 1] and sum(per_pos) == 6


def test_policy_drafter_ops_spool_and_version(registry) -> None:
    for k in (0, 2, 2):
        recorder.record_policy_k(k)
    assert value(registry, "specopd:spec_policy_k_total", k=2) == 2 and value(registry, "specopd:spec_policy_k_total",
                                                                              k=0) == 1
    recorder.set_drafter_version("initial")
    recorder.set_drafter_version("v2")
    assert value(registry, "specopd:drafter_info", version="initial") == 0
    assert value(registry, "specopd:drafter_info", version="v2") == 1
    for op, status in (("swap_drafter", 200), ("stage_drafter", 200), ("commit_drafter", 409),
                       ("abort_drafter", 500), ("drafter_info", 200), ("traffic", 200)):
        recorder.record_control_op(op, status)
    assert value(registry, "specopd:drafter_ops_total", op="swap", outcome="ok") == 1
    assert value(registry, "specopd:drafter_ops_total", op="commit", outcome="refused") == 1
    assert value(registry, "specopd:drafter_ops_total", op="abort", outcome="error") == 1
    assert value(registry, "specopd:drafter_ops_total", op="drafter_info", outcome="ok") is None  # not a drafter op
    recorder.record_control_op("commit_drafter", 200, json.dumps({"version": "v3", "previous_version": "v2"}).encode())
    assert [value(registry, "specopd:drafter_info", version=v) for v in ("initial", "v2", "v3")] == [0, 0, 1]
    assert value(registry, "specopd:drafter_ops_total", op="commit", outcome="ok") == 1
    recorder.set_spool_bytes(1234)
    assert value(registry, "specopd:traffic_spool_bytes") == 1234
    recorder.record_control_op("traffic", 200, b"{}", b'{"action": "read", "after": 0}')
    assert value(registry, "specopd:traffic_spool_bytes") == 1234
    recorder.record_control_op("traffic", 200, b"{}", b'{"action": "purge"}')
    assert value(registry, "specopd:traffic_spool_bytes") == 0


def test_score_trees_requests_refusals_wait_and_depth(registry) -> None:
    class Reply:
        def __init__(self, status, wait=None):
            self.status_code = status
            self.headers = {"x-specopd-queue-wait-s": wait} if wait is not None else {}

    line = SimpleNamespace(active=0)

    async def route(reply):
        line.active = 2
        return reply

    async def scenario():
        for reply in (Reply(200, "0.300"), Reply(429), Reply(429, "1.5"), Reply(413)):
            line.active = 0
            assert await hooks.observe_score_trees(route, reply, lambda: line) is reply

    asyncio.run(scenario())
    assert value(registry, "specopd:score_trees_requests_total") == 4
    assert value(registry, "specopd:score_trees_refusals_total", code=429) == 2
    assert value(registry, "specopd:score_trees_refusals_total", code=413) == 1
    assert value(registry, "specopd:score_trees_queue_wait_seconds_count") == 2
    assert value(registry, "specopd:score_trees_queue_wait_seconds_sum") == pytest.approx(1.8)
    assert value(registry, "specopd:score_trees_queue_wait_seconds_bucket", le="0.5") == 1
    assert value(registry, "specopd:score_trees_queue_depth") == 2


def test_recording_off_records_nothing_and_a_failure_turns_it_off(registry, monkeypatch) -> None:
    recorder.configure(enabled=False, registry=registry)
    recorder.record_verify([1], 2)
    recorder.set_spool_bytes(5)
    assert value(registry, "specopd:spec_decode_num_drafts_total") is None
    assert asyncio.run(hooks.observe_score_trees(lambda r: _coro(r), "ok", lambda: 1 / 0)) == "ok"  # line not read
    recorder.configure(enabled=True, model_name="tiny", registry=registry)
    recorder.record_verify([1], [object()])  # a bad row: logged, recording stops, nothing raised
    assert not recorder.enabled()


async def _coro(x):
    return x


def test_configure_scheduler_follows_enable_metrics_and_the_tp_rank(monkeypatch) -> None:
    from prometheus_client import CollectorRegistry

    rank = SimpleNamespace(attn_tp_rank=0)
    monkeypatch.setattr(hooks.compat, "get", lambda name: (lambda: rank))
    reg = CollectorRegistry()
    sched = SimpleNamespace(server_args=SimpleNamespace(enable_metrics=False, served_model_name="m", model_path="/p"))
    assert not hooks.configure_scheduler(sched, lambda: "initial")
    sched.server_args.enable_metrics = True
    rank.attn_tp_rank = 1
    assert not hooks.configure_scheduler(sched, lambda: "initial")  # rank 0 of the TP group records
    rank.attn_tp_rank = 0
    real = recorder.configure
    monkeypatch.setattr(recorder, "configure", lambda args, enabled: real(args, enabled=enabled, registry=reg))
    assert hooks.configure_scheduler(sched, lambda: "initial")
    assert reg.get_sample_value("specopd:drafter_info", {"model_name": "m", "version": "initial"}) == 1
    real(enabled=False)


_CHILD = """
import sys
from sglang_specopd.server.metrics import recorder
recorder.configure(enabled=True, model_name="tiny")
recorder.record_verify([2, 1], 2)
recorder.set_drafter_version(sys.argv[1])
"""


def test_multiprocess_mode_aggregates_processes_as_sglangs_metrics_route(tmp_path) -> None:
    # SGLang's /metrics: a MultiProcessCollector over PROMETHEUS_MULTIPROC_DIR, written by every process
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for version in ("initial", "v2"):
        subprocess.run([sys.executable, "-c", _CHILD, version], env=env, check=True, timeout=60)
    out = subprocess.run([sys.executable, "-c", "from prometheus_client import CollectorRegistry, generate_latest, "
                          "multiprocess; r = CollectorRegistry(); multiprocess.MultiProcessCollector(r); "
                          "print(generate_latest(r).decode())"], env=env, check=True, timeout=60,
                         capture_output=True, text=True).stdout
    assert 'specopd:spec_decode_num_drafts_total{model_name="tiny"} 4.0' in out
    assert 'specopd:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="2"} 2.0' in out
    assert 'specopd:drafter_info{model_name="tiny",version="v2"} 1.0' in out


def test_adapter_exports_its_counters_on_its_own_port() -> None:
    from sglang_specopd.app.adapt_metrics import serve_adapt_metrics
    from sglang_specopd.app.launch.process import free_port
    from specopd_trainer.adapt.state import AdaptState

    state = AdaptState(pushes=2, rollbacks=1, step=7)
    state.note_verdict({"kind": "candidate", "deploy": True})
    state.note_verdict({"kind": "candidate", "deploy": False})
    state.note_verdict({"kind": "push_error", "error": "x"})  # not a guard verdict
    again = AdaptState.from_dict(json.loads(json.dumps(state.as_dict())))  # persisted with the run
    assert again.verdict_counts == {"candidate:deploy": 1, "candidate:hold": 1} and again.last_verdict_unix
    adapter = SimpleNamespace(state=again, run_dir=Path("runs/adapt-x"))
    port = free_port()
    server, thread = serve_adapt_metrics(adapter, port, "tiny", host="127.0.0.1")
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
    from prometheus_client.parser import text_string_to_metric_families

    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(text) for s in fam.samples}
    base = (("model_name", "tiny"), ("run", "adapt-x"))

    def sample(name, **labels):
        return got.get((name, tuple(sorted(base + tuple(labels.items())))))

    assert sample("specopd:adapt_pushes_total") == 2 and sample("specopd:adapt_rollbacks_total") == 1
    assert sample("specopd:adapt_train_steps_total") == 7
    assert sample("specopd:adapt_guard_verdicts_total", kind="candidate", outcome="hold") == 1
    assert sample("specopd:adapt_guard_verdicts_total", kind="deployed_vs_previous", outcome="deploy") == 0
    assert 0 <= sample("specopd:adapt_seconds_since_last_verdict") < 60
    for s in ADAPTER_SERIES:
        assert exposed(s) in text


def test_series_table() -> None:
    names = [s.name for s in ALL_SERIES]
    assert len(set(names)) == len(names) and all(n.startswith("specopd:") for n in names)
    assert {s.process for s in SERVER_SERIES} == {"scheduler", "http"}
    assert by_name("spec_decode_num_drafts_total").kind == "counter"


RULES = REPO / "deploy/prometheus/specopd-alerts.yaml"


def _rules() -> list:
    import yaml

    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _known(name: str) -> bool:
    """A series of the table (a histogram's ``_bucket`` / ``_sum`` / ``_count`` too) or a recording rule's."""
    if any(r.get("record", "").startswith(name) for r in _rules()):
        return True
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    try:
        by_name(name if name.endswith("_total") or base == name else base)
        return True
    except KeyError:
        return False


def _specopd_names(text: str) -> set:
    return set(re.findall(r"specopd:[a-z_]+", text))


def test_deploy_alert_rules_parse_and_name_real_series() -> None:
    rules = _rules()
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert {"SpecOPDAcceptanceBelowBreakEven", "SpecOPDAdapterRollback", "SpecOPDAdapterNoVerdict",
            "SpecOPDScoreTreesRefused"} <= set(alerts)
    assert alerts["SpecOPDAcceptanceBelowBreakEven"]["for"] == "10m"
    assert "specopd:break_even_acceptance_length" in alerts["SpecOPDAcceptanceBelowBreakEven"]["expr"]
    for r in rules:
        assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations"}, r
        assert isinstance(r["expr"], str) and r["expr"].count("(") == r["expr"].count(")"), r
        assert {n for n in _specopd_names(r["expr"]) if not _known(n)} == set(), r


def test_deploy_dashboard_parses_and_names_real_series() -> None:
    dash = json.loads((REPO / "deploy/grafana/specopd-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 6 and all(e.count("(") == e.count(")") for e in exprs)
    used = set().union(*(_specopd_names(e) for e in exprs))
    assert {n for n in used if not _known(n)} == set()
    for wanted in ("specopd:spec_decode_num_accepted_tokens_total", "specopd:spec_decode_num_drafts_total",
                   "specopd:spec_decode_num_accepted_tokens_per_pos_total", "specopd:drafter_info",
                   "specopd:spec_policy_k_total", "specopd:score_trees_queue_depth", "specopd:adapt_pushes_total",
                   "specopd:adapt_rollbacks_total"):
        assert wanted in used


def test_docs_name_every_series() -> None:
    text = (REPO / "docs/metrics.md").read_text()
    assert [exposed(s) for s in ALL_SERIES if exposed(s) not in text] == []
