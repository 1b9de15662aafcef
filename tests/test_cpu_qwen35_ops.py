"""The CPU stand-ins of the four ``torch.ops.sgl_kernel`` ops SGLang's ``models/qwen3_5.py`` binds at import on a
CPU device (``sgl_kernel_standin/sgl_kernel/qwen3_5.py``; Qwen4-Exp reuses that module), called as registered ops
the way SGLang's CPU call sites call them, against transformers' Qwen4-Exp modules (Gemma RMSNorm, the q / gate
split of the gated attention) and hand-built layouts. Nothing here imports SGLang."""

from __future__ import annotations

import pytest
import torch

from fakes.standin import load_standin

T, HQ, HKV, D = 5, 4, 2, 16


@pytest.fixture(scope="module")
def ops():
    load_standin()  # registers torch.ops.sgl_kernel.*
    return torch.ops.sgl_kernel


def _rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _gemma_norm(dim: int, seed: int):
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextRMSNorm

    norm = Qwen4ExpTextRMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(0.3 * _rand(dim, seed=seed))
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_gemma_rmsnorm_matches_transformers_norm(ops, dtype) -> None:
    qn, kn = _gemma_norm(D, 1), _gemma_norm(D, 2)
    qkv = _rand(T, (HQ + 2 * HKV) * D, seed=3, dtype=dtype)
    q, k, _ = qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)  # strided views, as from qkv.split
    q_out, k_out = ops.fused_qk_gemma_rmsnorm_cpu(q, k, qn.weight, kn.weight, 1e-6, D)
    assert q_out.shape == (T * HQ, D) and k_out.shape == (T * HKV, D) and q_out.dtype == dtype
    tol = dict(atol=0, rtol=0) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    with torch.no_grad():
        torch.testing.assert_close(q_out, qn(q.reshape(T, HQ, D)).reshape(-1, D), **tol)
        torch.testing.assert_close(k_out, kn(k.reshape(T, HKV, D)).reshape(-1, D), **tol)


def test_qk_gemma_rmsnorm_with_gate_deinterleaves_as_transformers(ops) -> None:
    """q_proj's output is per head [q_h | gate_h] (transformers' Qwen4ExpTextAttention chunks each head in two)."""
    qn, kn = _gemma_norm(D, 4), _gemma_norm(D, 5)
    qkv = _rand(T, HQ * 2 * D + 2 * HKV * D, seed=6)
    q_gate, k, _ = qkv.split([HQ * 2 * D, HKV * D, HKV * D], dim=-1)
    q_out, k_out, gate_out = ops.fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, qn.weight, kn.weight, 1e-6, D, HQ)
    want_q, want_gate = torch.chunk(q_gate.reshape(T, HQ, 2 * D), 2, dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(q_out, qn(want_q).reshape(-1, D), atol=0, rtol=0)
        torch.testing.assert_close(k_out, kn(k.reshape(T, HKV, D)).reshape(-1, D), atol=0, rtol=0)
    assert torch.equal(gate_out, want_gate.reshape(-1, D)) and gate_out.is_contiguous()


def test_sigmoid_mul_in_place_flat_and_strided_gate(ops) -> None:
    x = _rand(T, HQ * D, seed=7)
    q_gate = _rand(T, HQ, 2 * D, seed=8)
    gate3d = q_gate[..., D:]  # strided [T, H, D] view, as qwen3_5's non-fused prepare path passes
    want = x * torch.sigmoid(gate3d.reshape(T, -1))
    ops.fused_sigmoid_mul_cpu(x, gate3d)
    torch.testing.assert_close(x, want, atol=0, rtol=0)
    flat = _rand(T, HQ * D, seed=9)
    want2 = x * torch.sigmoid(flat)
    ops.fused_sigmoid_mul_cpu(x, flat)
    torch.testing.assert_close(x, want2, atol=0, rtol=0)
    with pytest.raises(RuntimeError):
        ops.fused_sigmoid_mul_cpu(x, _rand(T, 3, seed=1))


def test_qkvzba_split_contiguous_layout(ops) -> None:
    """[all_q | all_k | all_v | all_z] and [all_b | all_a] -> ([q|k|v], z [T,Hv,Dv], b, a), element by element."""
    hk, hv, dk, dv = 2, 4, 3, 5
    widths = [hk * dk, hk * dk, hv * dv, hv * dv]
    qkvz = torch.arange(T * sum(widths), dtype=torch.float32).reshape(T, -1)
    ba = -torch.arange(T * 2 * hv, dtype=torch.float32).reshape(T, -1)
    mixed_qkv, z, b, a = ops.fused_qkvzba_split_reshape_cat_contiguous_cpu(qkvz, ba, hk, hv, dk, dv)
    q, k, v, zz = qkvz.split(widths, dim=-1)
    assert torch.equal(mixed_qkv, torch.cat([q, k, v], -1)) and torch.equal(z, zz.reshape(T, hv, dv))
    assert torch.equal(b, ba[:, :hv]) and torch.equal(a, ba[:, hv:])
    assert all(t.is_contiguous() for t in (mixed_qkv, z, b, a))


@pytest.mark.slow
def test_sglang_qwen3_5_and_qwen4_exp_import_on_the_cpu_engine() -> None:
    """With the stand-in first on the path (as ``specopd serve --device cpu`` starts the server), SGLang's
    ``models/qwen3_5`` binds the four ops at import and ``models/qwen4_exp`` registers its entry class (without
    them: AttributeError at import, and the model registry drops both architectures). A subprocess, so the CPU
    engine switch and the stand-in stay out of this process."""
    import os
    import subprocess
    import sys

    from fakes.standin import STANDIN_INIT

    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(STANDIN_INIT.parent.parent)}
    code = ("import sglang.srt.models.qwen4_exp as m, sglang.srt.models.qwen3_5 as q; "
            "print(m.EntryClass[0].__name__, q.fused_qk_gemma_rmsnorm.__name__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["Qwen4ExpForConditionalGeneration", "fused_qk_gemma_rmsnorm_cpu"]
