"""The CPU stand-ins of SGLang's Gated DeltaNet (GDN) ops, each against the plain-torch references.

Stand-in ops (``sgl_kernel_standin/sgl_kernel/mamba.py``, registered as ``torch.ops.sgl_kernel.*`` by
``_torch_ops.py``) are called the way SGLang 0.5.23's CPU path calls them (layers/attention/linear/gdn_backend.py,
kernels/gdn_triton.py) and compared with :mod:`specopd_kernels.gdn.naive` (the token recurrence, the causal conv)
on pool-shaped state buffers: outputs, the states written back at the right slots, untouched slots unchanged.
The torch replacements of Triton-only layers (:mod:`sglang_specopd.server.cpu.hybrid_gdn`) are compared with
transformers' Qwen3-Next modules. Nothing here imports SGLang.
"""

from __future__ import annotations

import pytest
import torch

from specopd_kernels.gdn import causal_conv1d_naive, gdn_gates, gdn_recurrent_naive, random_gdn_params
from fakes.standin import load_standin

H, HV, DK, DV, W = 2, 4, 8, 6, 4
C = 2 * H * DK + HV * DV
SLOTS = 5
TOL = dict(atol=2e-5, rtol=2e-5)


@pytest.fixture(scope="module")
def ops():
    return load_standin().mamba


@pytest.fixture(scope="module")
def params():
    return random_gdn_params(H, HV, DK, DV, W, seed=3)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_causal_conv1d_fn_varlen_with_and_without_initial_window(ops, params) -> None:
    lens, slots, has_init = [5, 2, 7], [3, 0, 4], [False, True, True]
    x = _rand(sum(lens), C, seed=1)
    conv_states = _rand(SLOTS, C, W - 1, seed=2)
    before = conv_states.clone()
    qsl = torch.tensor([0, 5, 7, 14], dtype=torch.int32)
    y = ops.causal_conv1d_fn_cpu(x.T, params.conv_weight, None, activation="silu", conv_states=conv_states,
                                 has_initial_state=torch.tensor(has_init), cache_indices=torch.tensor(slots),
                                 query_start_loc=qsl, seq_lens_cpu=lens)
    assert y.shape == (C, sum(lens))
    for i, (s, e) in enumerate(zip(qsl[:-1].tolist(), qsl[1:].tolist())):
        window = before[slots[i]] if has_init[i] else None
        want, final = causal_conv1d_naive(x[s:e], params.conv_weight, None, window, "silu")
        torch.testing.assert_close(y.T[s:e], want, **TOL)
        torch.testing.assert_close(conv_states[slots[i]], final, **TOL)
    # The 2-token sequence's window reaches into its old window (T < W - 1).
    torch.testing.assert_close(conv_states[0], torch.cat([before[0][:, 2:], x[5:7].T], 1))
    for untouched in set(range(SLOTS)) - set(slots):
        assert torch.equal(conv_states[untouched], before[untouched])


def test_causal_conv1d_update_decode_and_verify_windows(ops, params) -> None:
    conv_states = _rand(SLOTS, C, W - 1, seed=4)
    before = conv_states.clone()
    slots = torch.tensor([2, 4])
    x = _rand(2, C, seed=5)  # decode: [B, C]
    y = ops.causal_conv1d_update_cpu(x, conv_states, params.conv_weight, None, "silu", conv_state_indices=slots)
    for i, slot in enumerate(slots.tolist()):
        want, final = causal_conv1d_naive(x[i:i + 1], params.conv_weight, None, before[slot], "silu")
        torch.testing.assert_close(y[i], want[0], **TOL)
        torch.testing.assert_close(conv_states[slot], final)
    # TARGET_VERIFY: a block of n tokens per request, [B, C, n], the window after each step saved.
    n = 3
    before = conv_states.clone()
    xb = _rand(2, C, n, seed=6)
    inter = torch.zeros(3, n, C, W - 1)
    yb = ops.causal_conv1d_update_cpu(xb, conv_states, params.conv_weight, None, "silu", conv_state_indices=slots,
                                      intermediate_conv_window=inter,
                                      intermediate_state_indices=torch.tensor([1, 0]))
    for i, (slot, line) in enumerate(zip(slots.tolist(), [1, 0])):
        want, final = causal_conv1d_naive(xb[i].T, params.conv_weight, None, before[slot], "silu")
        torch.testing.assert_close(yb[i].T, want, **TOL)
        torch.testing.assert_close(conv_states[slot], final)
        for t in range(n):
            _, after_t = causal_conv1d_naive(xb[i, :, :t + 1].T, params.conv_weight, None, before[slot], "silu")
            torch.testing.assert_close(inter[line, t], after_t)
    with pytest.raises(NotImplementedError, match="tree"):
        ops.causal_conv1d_update_cpu(xb, conv_states, params.conv_weight, None, "silu", conv_state_indices=slots,
                                     retrieve_parent_token=torch.zeros(2, n, dtype=torch.long))


def test_fused_gdn_gating_matches_reference_gates(ops, params) -> None:
    ops_ns = torch.ops.sgl_kernel
    a, b = _rand(7, HV, seed=7) * 3, _rand(7, HV, seed=8) * 3
    g, beta = ops_ns.fused_gdn_gating_cpu(params.A_log, a, b, params.dt_bias)
    g_ref, beta_ref = gdn_gates(a, b, params)
    assert g.shape == beta.shape == (1, 7, HV) and g.dtype == torch.float32
    torch.testing.assert_close(g[0], g_ref)
    torch.testing.assert_close(beta[0].float(), beta_ref)
    assert (g <= 0).all()


def _qkv(t, seed):
    return _rand(1, t, H, DK, seed=seed), _rand(1, t, H, DK, seed=seed + 1), _rand(1, t, HV, DV, seed=seed + 2)


def test_chunk_gated_delta_rule_varlen_in_place(ops, params) -> None:
    lens, slots = [70, 3], [2, 0]  # 70 > one chunk of 64
    t = sum(lens)
    q, k, v = _qkv(t, 10)
    a, b = _rand(t, HV, seed=13), _rand(t, HV, seed=14)
    g, beta = ops.fused_gdn_gating_cpu(params.A_log, a, b, params.dt_bias)
    pool = _rand(SLOTS, HV, DV, DK, seed=15) * 0.1
    before = pool.clone()
    o, finals, h = ops.chunk_gated_delta_rule_cpu(q=q, k=k, v=v, g=g, beta=beta, initial_state=pool,
                                                  cu_seqlens=torch.tensor([0, 70, 73]), head_first=False,
                                                  use_qk_l2norm_in_kernel=True,
                                                  initial_state_indices=torch.tensor(slots))
    assert o.shape == (1, t, HV, DV) and h is None and finals.shape == (2, HV, DV, DK)
    for (s, e), slot, final in zip([(0, 70), (70, 73)], slots, finals):
        want, state = gdn_recurrent_naive(q[0, s:e], k[0, s:e], v[0, s:e], g[0, s:e], beta[0, s:e], before[slot])
        torch.testing.assert_close(o[0, s:e], want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(pool[slot], state, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(final, state, atol=1e-4, rtol=1e-4)
    for untouched in (1, 3, 4):
        assert torch.equal(pool[untouched], before[untouched])


def test_fused_sigmoid_gating_delta_rule_update_decode_and_verify(ops, params) -> None:
    # decode: one token per request, called through torch.ops with SGLang's keyword arguments
    q, k, v = _qkv(2, 20)
    a, b = _rand(2, HV, seed=23), _rand(2, HV, seed=24)
    pool = _rand(SLOTS, HV, DV, DK, seed=25) * 0.1
    before = pool.clone()
    slots = torch.tensor([4, 1])
    o = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=params.A_log, dt_bias=params.dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
        initial_state_indices=slots, cu_seqlens=torch.tensor([0, 1, 2]), use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0, softplus_threshold=20.0)
    g, beta = gdn_gates(a, b, params)
    for i, slot in enumerate(slots.tolist()):
        want, state = gdn_recurrent_naive(q[0, i:i + 1], k[0, i:i + 1], v[0, i:i + 1], g[i:i + 1], beta[i:i + 1],
                                          before[slot])
        torch.testing.assert_close(o[0, i], want[0], **TOL)
        torch.testing.assert_close(pool[slot], state, **TOL)
    # TARGET_VERIFY: n tokens per request, the pool untouched, the state after each token cached.
    n = 3
    q, k, v = _qkv(2 * n, 30)
    a, b = _rand(2 * n, HV, seed=33), _rand(2 * n, HV, seed=34)
    before = pool.clone()
    inter = torch.zeros(2, n, HV, DV, DK)
    o = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=params.A_log, dt_bias=params.dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
        initial_state_indices=slots, cu_seqlens=torch.tensor([0, n, 2 * n]), use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0, softplus_threshold=20.0, is_kda=False, disable_state_update=True,
        intermediate_states_buffer=inter, intermediate_state_indices=torch.tensor([1, 0]), cache_steps=n,
        retrieve_parent_token=None)
    assert torch.equal(pool, before)
    g, beta = gdn_gates(a, b, params)
    for i, (slot, line) in enumerate(zip(slots.tolist(), [1, 0])):
        s = i * n
        want, _ = gdn_recurrent_naive(q[0, s:s + n], k[0, s:s + n], v[0, s:s + n], g[s:s + n], beta[s:s + n],
                                      before[slot])
        torch.testing.assert_close(o[0, s:s + n], want, **TOL)
        for t in range(n):
            _, state_t = gdn_recurrent_naive(q[0, s:s + t + 1], k[0, s:s + t + 1], v[0, s:s + t + 1],
                                             g[s:s + t + 1], beta[s:s + t + 1], before[slot])
            torch.testing.assert_close(inter[line, t], state_t, **TOL)


def test_prefill_then_decode_equals_one_prefill(ops, params) -> None:
    """A layer core run as SGLang does (prefill of P tokens, then decode steps) equals one reference pass."""
    t, p = 12, 9
    x = _rand(t, C, seed=40)
    a, b = _rand(t, HV, seed=41), _rand(t, HV, seed=42)
    conv, pool = torch.zeros(SLOTS, C, W - 1), torch.zeros(SLOTS, HV, DV, DK)
    slot = torch.tensor([3])
    y = ops.causal_conv1d_fn_cpu(x[:p].T, params.conv_weight, None, activation="silu", conv_states=conv,
                                 has_initial_state=torch.tensor([False]), cache_indices=slot,
                                 query_start_loc=torch.tensor([0, p])).T
    q, k, v = torch.split(y, [H * DK, H * DK, HV * DV], -1)
    g, beta = ops.fused_gdn_gating_cpu(params.A_log, a[:p], b[:p], params.dt_bias)
    outs = [ops.chunk_gated_delta_rule_cpu(q.reshape(1, p, H, DK), k.reshape(1, p, H, DK), v.reshape(1, p, HV, DV),
                                           g, beta, pool, torch.tensor([0, p]), initial_state_indices=slot)[0][0]]
    for i in range(p, t):
        yi = ops.causal_conv1d_update_cpu(x[i:i + 1], conv, params.conv_weight, None, "silu", conv_state_indices=slot)
        qi, ki, vi = torch.split(yi, [H * DK, H * DK, HV * DV], -1)
        outs.append(ops.fused_sigmoid_gating_delta_rule_update_cpu(
            params.A_log, params.dt_bias, qi.reshape(1, 1, H, DK), ki.reshape(1, 1, H, DK), vi.reshape(1, 1, HV, DV),
            a[i:i + 1], b[i:i + 1], pool, slot, torch.tensor([0, 1]))[0])
    ref_y, _ = causal_conv1d_naive(x, params.conv_weight, None, None, "silu")
    rq, rk, rv = torch.split(ref_y, [H * DK, H * DK, HV * DV], -1)
    rg, rbeta = gdn_gates(a, b, params)
    want, state = gdn_recurrent_naive(rq.reshape(t, H, DK), rk.reshape(t, H, DK), rv.reshape(t, HV, DV), rg, rbeta)
    torch.testing.assert_close(torch.cat(outs), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pool[3], state, atol=1e-4, rtol=1e-4)


def test_rms_norm_gated_and_shared_gate_match_transformers() -> None:
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

    from sglang_specopd.server.cpu.hybrid_gdn import gate_sigmoid_mul_add, rms_norm_gated

    x, gate = _rand(5, 3, 16, seed=50), _rand(5, 3, 16, seed=51)
    norm = Qwen3NextRMSNormGated(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * _rand(16, seed=52))
        want = norm(x, gate)
    torch.testing.assert_close(rms_norm_gated(x, gate, norm.weight, 1e-6, "silu"), want, **TOL)
    with pytest.raises(ValueError, match="activation"):
        rms_norm_gated(x, gate, None, 1e-6, "relu")
    hidden, shared, final = _rand(4, 16, seed=53), _rand(4, 16, seed=54), _rand(4, 16, seed=55)
    w = _rand(16, seed=56)
    want = final + torch.sigmoid(hidden @ w)[:, None] * shared
    gate_sigmoid_mul_add(hidden, w, shared, final)
    torch.testing.assert_close(final, want, **TOL)


def test_cpu_launch_keeps_mamba_conv_windows_in_float32() -> None:
    """SGLang's default bf16 conv windows made a float32 hybrid server's decode differ from transformers."""
    from sglang_specopd.server.plugin import launch_environment

    assert launch_environment("cpu", base={})["SGLANG_MAMBA_CONV_DTYPE"] == "float32"
    kept = launch_environment("cpu", base={"SGLANG_MAMBA_CONV_DTYPE": "bfloat16"})
    assert kept["SGLANG_MAMBA_CONV_DTYPE"] == "bfloat16"
    assert "SGLANG_MAMBA_CONV_DTYPE" not in launch_environment("cuda", base={})


def test_scatter_states_after_verify_commits_the_accepted_step() -> None:
    """After a chain verify, each request's slot gets the state / conv window of its last accepted step."""
    from types import SimpleNamespace

    from sglang_specopd.server.cpu.hybrid_gdn import scatter_states_after_verify

    layers, steps = 2, 4
    caches = SimpleNamespace(
        temporal=_rand(layers, SLOTS, HV, DV, DK, seed=60),
        intermediate_ssm=_rand(layers, 3, steps, HV, DV, DK, seed=61),
        conv=[_rand(layers, SLOTS, C, W - 1, seed=62)],
        intermediate_conv_window=[_rand(layers, 3, steps, C, W - 1, seed=63)])
    before_ssm, before_conv = caches.temporal.clone(), caches.conv[0].clone()
    slots, last = torch.tensor([4, 1, 2]), torch.tensor([2, -1, 0])  # request 1: nothing accepted to commit
    scatter_states_after_verify(caches, slots, last, None, None)
    assert torch.equal(caches.temporal[:, 4], caches.intermediate_ssm[:, 0, 2])
    assert torch.equal(caches.temporal[:, 2], caches.intermediate_ssm[:, 2, 0])
    assert torch.equal(caches.conv[0][:, 4], caches.intermediate_conv_window[0][:, 0, 2])
    for untouched in (0, 1, 3):
        assert torch.equal(caches.temporal[:, untouched], before_ssm[:, untouched])
        assert torch.equal(caches.conv[0][:, untouched], before_conv[:, untouched])
