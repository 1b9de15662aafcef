"""benchmarks/concurrency_reference/run.py: bench payloads -> speedup and tau with intervals per level and temperature."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _scripts import load_benchmark

from sglang_specopd.app.results import portable

DOMAINS = ["dialogue", "coding", "math", "agentic"]


def _req(i, domain, tokens, verify, ok=True):
    return {"id": f"{domain}/{i}", "domain": domain, "ok": ok, "completion_tokens": tokens, "verify_ct": verify}


def _payload(spec_tps, base_tps, verify_per_domain):
    reqs = [_req(i, d, 20, v) for d, v in verify_per_domain.items() for i in range(3)]
    reqs.append(_req(9, "math", 50, None, ok=False))  # a failed request carries no acceptance information
    lv = {"concurrency": 1, "specopd": {"output_tokens_per_s": spec_tps, "errors": 1, "per_request": reqs},
          "baseline": {"output_tokens_per_s": base_tps, "errors": 0}}
    return {"levels": [lv], "target": "/models/x", "load_average_1m": 1.5}


def test_summarize_gives_speedup_and_tau_per_domain() -> None:
    cr = load_benchmark("concurrency_reference")
    got = cr.summarize({"T0": _payload(30.0, 20.0, {"dialogue": 10, "coding": 8, "math": 5, "agentic": 10})},
                       DOMAINS)
    lv = got["T0"][0]
    assert lv["speedup"] == pytest.approx(1.5) and lv["errors"] == {"specopd": 1, "plain": 0}
    acc = lv["acceptance"]
    assert acc["dialogue"] == pytest.approx(2.0) and acc["coding"] == pytest.approx(2.5)
    assert acc["math"] == pytest.approx(4.0) and acc["prompts"]["math"] == 3
    assert acc["mean"] == pytest.approx((2.0 + 2.5 + 4.0 + 2.0) / 4)
    assert acc["ci95"][0] <= acc["mean"] <= acc["ci95"][1]


def test_main_reuses_finished_runs_and_writes_the_result(tmp_path: Path) -> None:
    cr = load_benchmark("concurrency_reference")
    run = tmp_path / "run"
    run.mkdir()
    for key, s in (("T0", 30.0), ("T1", 24.0)):
        (run / f"{key}.json").write_text(json.dumps(_payload(s, 20.0, dict.fromkeys(DOMAINS, 10))))
    out = tmp_path / "results" / "concurrency_reference_smollm2_cpu.json"
    assert cr.main(["--run-dir", str(run), "--out", str(out), "--limit", "3"]) == 0  # no server: both runs exist
    data = json.loads(out.read_text())
    assert [lv["speedup"] for lv in (data["temperatures"]["T0"][0], data["temperatures"]["T1"][0])] == \
        pytest.approx([1.5, 1.2])
    assert data["counts_as_result"] is False  # 3 prompts per domain < 24
    assert out.with_suffix(".png").is_file()


def test_keep_from_carries_the_temperatures_this_run_did_not_measure(tmp_path: Path) -> None:
    cr = load_benchmark("concurrency_reference")
    drafter = str(tmp_path / "drafter")
    first, second = tmp_path / "run0", tmp_path / "run1"
    for d in (first, second):
        d.mkdir()
    (first / "T0.json").write_text(json.dumps(_payload(30.0, 20.0, dict.fromkeys(DOMAINS, 10))))
    (second / "T1.json").write_text(json.dumps(_payload(24.0, 20.0, dict.fromkeys(DOMAINS, 5))))
    out = tmp_path / "results" / "concurrency_reference_smollm2_cpu.json"
    common = ["--out", str(out), "--limit", "3", "--drafter", drafter]
    assert cr.main(["--run-dir", str(first), "--temperatures", "0", *common]) == 0
    t0 = json.loads(out.read_text())
    assert cr.main(["--run-dir", str(second), "--temperatures", "1", "--keep-from", str(out), *common]) == 0
    data = json.loads(out.read_text())
    assert sorted(data["temperatures"]) == ["T0", "T1"]
    assert data["temperatures"]["T0"] == t0["temperatures"]["T0"]  # carried verbatim
    assert data["temperatures"]["T1"][0]["speedup"] == pytest.approx(1.2)
    assert data["temperatures"]["T1"][0]["acceptance"]["mean"] == pytest.approx(4.0)  # 20 tokens / 5 verifies
    assert data["raw_payloads"]["T0"] == portable(str(first / "T0.json")) and data["carried_from"]["T0"]["created"] == t0["created"]
    assert "T1" not in data["carried_from"]
    # a different setting (more new tokens) is refused and writes nothing
    before = out.read_text()
    assert cr.main(["--run-dir", str(second), "--temperatures", "1", "--keep-from", str(out), *common,
                    "--max-new-tokens", "64"]) == 2
    assert out.read_text() == before
