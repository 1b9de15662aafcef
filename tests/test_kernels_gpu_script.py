"""The GPU acceptance run (benchmarks/kernels_gpu/run.py --all) runs end to end on CPU with tiny shapes (Triton under
TRITON_INTERPRET=1): every section, the per-kernel verdicts and the verified records (device cpu: they never verify),
and an earlier result file moved to history/, never overwritten."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "kernels_gpu" / "run.py"


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_kernels_gpu_script_cpu_smoke(tmp_path):
    from specopd_kernels.verified import is_verified, load_records, source_sha256

    out, recs = tmp_path / "kernels.json", tmp_path / "records.json"
    r = _run("--all", "--device", "cpu", "--small", "--repeats", "1", "--out", out, "--records", recs,
             "--git-commit", "abc123")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert list(res["section_wall_s"]) == ["alpha", "tree_alpha", "tree_attention", "tree_losses", "gdn_replay",
                                           "sparse_attention", "draft_sampler"]
    ver = res["verification"]
    assert {k: (v["passed"], v["checks"]) for k, v in ver.items()} == {
        "e2e_tv_fused": (True, 12), "tree_attention_triton": (True, 1), "tree_attention_flashinfer": (None, 0),
        "gdn_replay_triton": (True, 1), "sparse_attention_triton": (True, 1)}
    assert "tree_attention_flashinfer: not run (0 checks)" in r.stderr and "e2e_tv_fused: PASS (12 checks)" in r.stderr
    written = load_records(recs)
    assert sorted(written) == ["e2e_tv_fused", "gdn_replay_triton", "sparse_attention_triton", "tree_attention_triton"]
    for kernel, rec in written.items():
        assert rec["source_sha256"] == source_sha256(kernel) and rec["passed"] is True and rec["device"] == "cpu"
        assert is_verified(kernel, written) == (False, "its GPU record did not pass (device 'cpu', passed True)")
        assert rec["result_file"].startswith("$TMPDIR/") and rec["result_file"].endswith("/kernels.json")
    assert str(tmp_path) not in res["command"] and res["command"].startswith("python benchmarks/kernels_gpu/run.py --all")
    assert res["device"] == "cpu" and res["command"].startswith("python ")
    assert {(c["vocab"], c["dtype"]) for c in res["alpha"]} == {(1000, "float32"), (1000, "bfloat16"),
                                                                (4099, "float32"), (4099, "bfloat16")}
    for c in res["alpha"]:
        tol = 1e-5 if c["dtype"] == "float32" else 2e-2
        assert c["max_abs_alpha_diff"] < tol and c["max_abs_grad_diff"] < tol, c
    assert {c["dtype"] for c in res["tree_alpha"]} == {"float32", "bfloat16"}
    for c in res["tree_alpha"]:
        assert c["target_rows"] > c["draft_rows"] == 3 * 4, c
        for path in ("chunked", "fused"):
            tol = 1e-5 if c["dtype"] == "float32" else 2e-2
            assert c[f"{path}_max_abs_alpha_diff"] < tol and c[f"{path}_max_abs_grad_diff"] < tol, c
    assert set(res) >= {"git_commit", "created", "machine", "versions"} and res["machine"]["gpu"] is None
    assert res["git_commit"] == "abc123"
    (att,) = res["tree_attention"]
    assert att["tokens"] == 24 + 3 * 2 * 3 and att["max_abs_diff"] < 1e-5
    assert att["triton_max_abs_diff"] < 1e-5 and att["sdpa_dense_mask_s"] > 0 and att["triton_s"] > 0, att
    assert [c["loss"] for c in res["tree_losses"]] == ["e2e_fkl", "e2e_fkl_is"]
    for c in res["tree_losses"]:
        assert c["rel_value_diff"] < 1e-5 and c["max_abs_grad_diff"] < 1e-6 < c["max_abs_grad"], c
    assert res["tree_losses"][0]["tree_value"] != res["tree_losses"][1]["tree_value"]
    (gdn,) = res["gdn_replay"]
    assert gdn["tokens"] == 24 + 3 * 2 * 3 and gdn["reference"] == "naive" and gdn["max_abs_output"] > 0.05, gdn
    assert gdn["replay_max_abs_diff"] < 1e-5 and gdn["triton_max_abs_diff"] < 1e-5, gdn
    assert min(gdn[k] for k in ("replay_s", "naive_s", "tree_torch_s", "triton_replay_s", "tree_triton_s")) > 0, gdn
    (sp,) = res["sparse_attention"]
    assert sp["tokens"] == 24 + 3 * 2 * 3 and sp["reference"] == "naive" and 0 < sp["scored_rows"] < sp["rows"], sp
    assert sp["selection_matches_naive"] and sp["torch_max_abs_diff"] < 1e-5 and sp["triton_max_abs_diff"] < 1e-5, sp
    assert min(sp[k] for k in ("select_s", "torch_s", "naive_s", "triton_s", "full_tree_attention_triton_s")) > 0, sp
    ds = res["draft_sampler"]
    assert ds["draws"] == 2 * 1990 and ds["max_abs_freq_minus_q"] < 0.05, ds
    assert ds["q_matches_softmax"] and ds["greedy_rows_argmax"] and ds["greedy_rows_one_hot_q"], ds


def test_results_are_never_overwritten_and_sections_are_selectable(tmp_path):
    out = tmp_path / "kernels.json"
    out.write_text(json.dumps({"created": "2026-01-02T03:04:05+00:00", "alpha": []}))
    r = _run("--only", "draft_sampler", "--device", "cpu", "--small", "--repeats", "1", "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "history" / "kernels.20260102T030405Z.json").read_text())["alpha"] == []
    res = json.loads(out.read_text())
    assert list(res["section_wall_s"]) == ["draft_sampler"] and "alpha" not in res
    assert all(v["passed"] is None for v in res["verification"].values())  # no kernel ran: nothing to record
    bad = _run("--only", "alpha,flash", "--device", "cpu", "--out", tmp_path / "x.json")
    assert bad.returncode == 2 and "unknown section(s) flash" in bad.stderr and not (tmp_path / "x.json").exists()


def test_checks_fail_a_kernel_outside_its_tolerance():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from kernels_gpu.checks import kernel_checks, summary

    payload = {"tree_attention": [
        {"prefix": 512, "anchors": 32, "dtype": "torch.bfloat16", "triton_max_abs_diff": 0.01,
         "flashinfer_max_abs_diff": 0.05},
        {"prefix": 512, "anchors": 32, "dtype": "torch.float32", "triton_max_abs_diff": 2e-4}],
        "gdn_replay": [{"prefix": 256, "dtype": "torch.bfloat16", "max_abs_output": 4.0, "triton_max_abs_diff": 0.1}]}
    s = summary(kernel_checks(payload))
    assert s["tree_attention_triton"]["passed"] is False
    assert s["tree_attention_triton"]["failed"] == ["tree_attention[prefix=512, anchors=32, float32] out"]
    assert s["tree_attention_flashinfer"]["passed"] is False and s["gdn_replay_triton"]["passed"] is True  # 0.1 < 0.12
    assert s["e2e_tv_fused"] == {"passed": None, "checks": 0, "failed": [], "worst": None}


def test_kernels_gpu_script_without_cuda_is_a_clear_error(tmp_path):
    import torch

    if torch.cuda.is_available():  # pragma: no cover - GPU machines run the real thing
        return
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
