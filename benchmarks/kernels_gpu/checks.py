"""Pass / fail of each kernel in a ``benchmarks/kernels_gpu/run.py`` result, and the verified records it earns.

A kernel passes when every one of its checks (a kernel-vs-reference difference in the result's case rows) is within
its tolerance and at least one check ran. Tolerances (absolute; per dtype of the case):

* E2E-TV alpha values (``fused_acceptance_alpha`` / tree alpha, fp32 math on both paths): fp32 1e-4, bf16 1e-3;
  their gradients w.r.t. the draft logits: fp32 1e-3, bf16 1e-2 (the first H200 run measured at most 8.9e-7 and
  1.8e-4);
* attention outputs (Triton / FlashInfer tree attention, Triton sparse attention; outputs O(1)): fp32 1e-4,
  bf16 / fp16 3e-2 (four bf16 ulps at 1.0);
* GDN replay outputs: the attention tolerance times max(1, the case's largest output).

The records (:func:`records`) carry the kernel's current source hash (:func:`specopd_kernels.verified.
source_sha256`), so any later edit of the kernel un-verifies it; a CPU (interpreter) run writes records with device
``cpu``, which never verify (tests use them).
"""

from __future__ import annotations

from typing import Any, Dict, List

VALUE_TOL = {"float32": 1e-4, "bfloat16": 1e-3, "float16": 1e-3}
GRAD_TOL = {"float32": 1e-3, "bfloat16": 1e-2, "float16": 1e-2}
OUT_TOL = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 3e-2}


def _dtype(row: dict) -> str:
    return str(row.get("dtype", "float32")).replace("torch.", "")


def _case(section: str, row: dict, keys=("rows", "vocab", "prefix", "anchors", "branches", "depth", "cached")) -> str:
    return section + "[" + ", ".join(f"{k}={row[k]}" for k in keys if k in row) + f", {_dtype(row)}]"


def kernel_checks(payload: Dict[str, Any]) -> Dict[str, List[dict]]:
    """kernel id -> its checks ``{"case", "what", "diff", "tol", "ok"}`` found in a benchmarks/kernels_gpu/run.py payload (a
    section that did not run, or a kernel that could not run, contributes none)."""
    out: Dict[str, List[dict]] = {k: [] for k in ("e2e_tv_fused", "tree_attention_triton", "tree_attention_flashinfer",
                                                  "gdn_replay_triton", "sparse_attention_triton")}

    def add(kernel: str, section: str, row: dict, key: str, what: str, tol: float) -> None:
        if key in row:
            diff = float(row[key])
            out[kernel].append({"case": _case(section, row), "what": what, "diff": diff, "tol": tol,
                                "ok": diff <= tol})

    for row in payload.get("alpha", []):
        add("e2e_tv_fused", "alpha", row, "max_abs_alpha_diff", "alpha", VALUE_TOL[_dtype(row)])
        add("e2e_tv_fused", "alpha", row, "max_abs_grad_diff", "grad", GRAD_TOL[_dtype(row)])
    for row in payload.get("tree_alpha", []):
        add("e2e_tv_fused", "tree_alpha", row, "fused_max_abs_alpha_diff", "alpha", VALUE_TOL[_dtype(row)])
        add("e2e_tv_fused", "tree_alpha", row, "fused_max_abs_grad_diff", "grad", GRAD_TOL[_dtype(row)])
    for row in payload.get("tree_attention", []):
        add("tree_attention_triton", "tree_attention", row, "triton_max_abs_diff", "out", OUT_TOL[_dtype(row)])
        add("tree_attention_flashinfer", "tree_attention", row, "flashinfer_max_abs_diff", "out", OUT_TOL[_dtype(row)])
    for row in payload.get("gdn_replay", []):
        scale = max(1.0, float(row.get("max_abs_output", 1.0)))
        add("gdn_replay_triton", "gdn_replay", row, "triton_max_abs_diff", "out", OUT_TOL[_dtype(row)] * scale)
    for row in payload.get("sparse_attention", []):
        add("sparse_attention_triton", "sparse_attention", row, "triton_max_abs_diff", "out", OUT_TOL[_dtype(row)])
    return out


def summary(checks: Dict[str, List[dict]]) -> Dict[str, dict]:
    """kernel -> ``{"passed", "checks", "failed": [case...], "worst": {case, what, diff, tol}}`` (``passed`` is
    None for a kernel with no check: it did not run here)."""
    out = {}
    for kernel, cs in checks.items():
        worst = max(cs, key=lambda c: c["diff"] / c["tol"], default=None)
        out[kernel] = {"passed": (all(c["ok"] for c in cs) if cs else None), "checks": len(cs),
                       "failed": [f"{c['case']} {c['what']}" for c in cs if not c["ok"]], "worst": worst}
    return out


def records(summ: Dict[str, dict], *, device: str, gpu: Any, versions: Dict[str, Any], git_commit: Any,
            created: str, result_file: str) -> Dict[str, dict]:
    """The verified records of the kernels that ran (:mod:`specopd_kernels.verified`): one per kernel with checks,
    ``passed`` as found, tied to the current source hash."""
    from specopd_kernels.verified import source_sha256

    return {kernel: {"source_sha256": source_sha256(kernel), "passed": s["passed"], "device": device, "gpu": gpu,
                     "torch": versions.get("torch"), "triton": versions.get("triton"), "git_commit": git_commit,
                     "created": created, "result_file": result_file, "checks": s["checks"], "failed": s["failed"],
                     "worst": s["worst"]}
            for kernel, s in summ.items() if s["checks"]}
