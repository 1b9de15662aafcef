"""The prepared GPU kernel check (benchmarks/kernels_gpu.py) runs end to end on CPU with tiny shapes."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_kernels_gpu_script_cpu_smoke(tmp_path):
    out = tmp_path / "kernels.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels_gpu.py"), "--device", "cpu", "--small",
                        "--repeats", "1", "--out", str(out), "--git-commit", "abc123"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
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


def test_kernels_gpu_script_without_cuda_is_a_clear_error(tmp_path):
    import torch

    if torch.cuda.is_available():  # pragma: no cover - GPU machines run the real thing
        return
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels_gpu.py"), "--out", str(tmp_path / "x.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
