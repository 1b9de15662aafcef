"""The CPU adaptations for Qwen4-Exp targets (:mod:`sglang_specopd.server.cpu.qwen4_exp`, adaptation 13), each
against transformers' Qwen4-Exp modules or the semantics of the SGLang kernel it replaces, on SGLang's own module
classes where they construct on this machine. The hooks are called directly (as SGLang's HookRegistry calls an
AROUND hook: ``hook(original_fn, *args)``); ``original_fn`` must not be reached for CPU tensors."""

from __future__ import annotations

import pytest
import torch

from sglang_specopd.server.cpu import qwen4_exp as q4


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _unreachable(*args, **kwargs):
    raise AssertionError("SGLang's kernel path was called for CPU tensors")


@pytest.mark.parametrize("activation", ["swish", "silu", "sigmoid"])
def test_gdn_output_norm_matches_transformers(activation) -> None:
    from sglang.kernels.ops.attention.fla.layernorm_gated import RMSNorm
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextRMSNormGated

    ours = RMSNorm(32, eps=1e-6, group_size=None, norm_before_gate=True, activation=activation)
    ref = Qwen4ExpTextRMSNormGated(32, eps=1e-6, activation="silu" if activation == "swish" else activation)
    with torch.no_grad():
        ours.weight.copy_(1 + 0.3 * _rand(32, seed=1))
        ref.weight.copy_(ours.weight)
    x, z = _rand(6, 32, seed=2), _rand(6, 32, seed=3)
    with torch.no_grad():
        got = q4.layernorm_gated_rmsnorm_forward(_unreachable, ours, x, z)
        torch.testing.assert_close(got, ref(x, z), atol=1e-6, rtol=1e-6)
        plain = q4.layernorm_gated_rmsnorm_forward(_unreachable, ours, x)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * ours.weight
    torch.testing.assert_close(plain, want.detach(), atol=1e-6, rtol=1e-6)
    # a configuration the hook does not cover goes to SGLang's own code
    ours.group_size = 16
    assert q4.layernorm_gated_rmsnorm_forward(lambda self, x, z: "sglang", ours, x, z) == "sglang"


def test_gated_residual_builds_in_the_serving_dtype_uncompiled_and_matches_transformers() -> None:
    """SGLang's GatedResidual through the hook: fp32 weights (the model passes bf16), mix / combine are the plain
    functions, and mix + combine equal transformers' Qwen4ExpTextGatedResidual (which returns the mixed input,
    the residual and the injection weights; combine = residual + block_output * injection per stream)."""
    from sglang.srt.layers.hyperconnection import GatedResidual, HyperConnectionConfig
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextGatedResidual

    hc, hidden, rank = 2, 64, 8
    cfg = HyperConnectionConfig(hc_count=hc, hidden_size=hidden, params_dtype=torch.bfloat16, hc_lowrank=rank,
                                rms_norm_eps=1e-6, hc_per_branch_norm=True)
    ours = GatedResidual.__new__(GatedResidual)
    q4.gated_residual_init_on_cpu(GatedResidual.__init__, ours, cfg, use_mix=True, use_combine=True)
    assert ours.params_dtype == torch.float32 and ours.input_mix_weight_down.weight.dtype == torch.float32
    assert not hasattr(ours._mix_compute, "_torchdynamo_orig_callable")
    assert not hasattr(ours._combine_compute, "_torchdynamo_orig_callable")

    tcfg = Qwen4ExpTextConfig(hidden_size=hidden, hc_count=hc, hc_lowrank=rank, rms_norm_eps=1e-6, num_experts=2,
                              num_experts_per_tok=2, num_hidden_layers=4)
    ref = Qwen4ExpTextGatedResidual(tcfg, use_combine=True)
    with torch.no_grad():
        for i, (name, p) in enumerate(ref.named_parameters()):
            p.copy_(0.3 * _rand(*p.shape, seed=10 + i))
        ours.hc_norm.weight.copy_(ref.hc_norm.weight)
        for name in ("input_mix_weight_down", "input_mix_weight_up", "block_inject_weight"):
            getattr(ours, name).weight.copy_(getattr(ref, name).weight)
        x, block_out = _rand(5, hc * hidden, seed=4), _rand(5, hidden, seed=5)
        mixed, residuals = ours.mix(x)
        want_mixed, residual, inject = ref(x)
        torch.testing.assert_close(mixed, want_mixed, atol=1e-5, rtol=1e-5)
        combined = ours.combine(block_out, residuals)
        want = (residual.unflatten(-1, (hc, hidden)) + block_out[:, None, :] * inject[..., None]).flatten(-2)
        torch.testing.assert_close(combined, want, atol=1e-5, rtol=1e-5)


def _gather_reference(compressed, table, cu, ratio):
    """The Triton kernel's semantics, one block at a time."""
    rows = []
    for s in range(cu.numel() - 1):
        for b in range(int(cu[s + 1] - cu[s])):
            rows.append(compressed[int(table[s, b * ratio]) // ratio])
    return torch.stack(rows) if rows else compressed[:0]


@pytest.mark.parametrize("blocks", [[3, 0, 2], [0, 0], [5]])
def test_gather_compressed_keys_matches_the_kernel_semantics(blocks) -> None:
    ratio, slots = 4, 64
    compressed = _rand(slots // ratio, 1, 8, seed=6).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(7)
    table = torch.zeros(len(blocks), 24, dtype=torch.int32)
    for s in range(len(blocks)):  # page-aligned groups: each block's tokens share one compressed slot
        pages = torch.randperm(slots // ratio, generator=gen)[:6]
        table[s] = (pages[:, None] * ratio + torch.arange(ratio)).flatten().to(torch.int32)
    cu = torch.tensor([0] + blocks, dtype=torch.int32).cumsum(0).to(torch.int32)
    got = q4.gather_compressed_keys_on_cpu(_unreachable, compressed, table, cu, sum(blocks), max(blocks), ratio)
    assert got.shape == (sum(blocks), 1, 8) and got.dtype == torch.bfloat16
    assert torch.equal(got, _gather_reference(compressed, table, cu, ratio))


def test_qsa_config_check_frees_only_the_block_topk_width(monkeypatch) -> None:
    from types import SimpleNamespace

    from sglang.srt.layers.attention.qsa import config as qsa_config

    def cfg(**kw):
        base = dict(indexer_n_heads=8, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=32,
                    indexer_compress_ratio=4)
        return SimpleNamespace(**{**base, **kw})

    with pytest.raises(ValueError, match="fast_topk_v2"):  # stock SGLang
        qsa_config.parse_qsa_profile(cfg())
    monkeypatch.setattr(qsa_config, "_COMPRESSED_BLOCK_TOPK", q4.AnyBlockTopK())
    q4.validate_qsa_config(cfg())  # budget 32 / ratio 4 = width 8: accepted on the CPU engine
    assert qsa_config.parse_qsa_profile(cfg()).block_topk == 8
    for bad, match in ((dict(indexer_kv_heads=2), "indexer_kv_heads=1"), (dict(indexer_budget=30), "divisible"),
                       (dict(indexer_compress_ratio=1), ">= 2"), (dict(indexer_head_dim=0), "positive"),
                       (dict(indexer_n_heads=None), "missing")):
        with pytest.raises(ValueError, match=match):
            q4.validate_qsa_config(cfg(**bad))
    assert 8 in q4.AnyBlockTopK() and 0 not in q4.AnyBlockTopK() and sorted(q4.AnyBlockTopK()) == [512, 2048]


def test_indexer_forward_native_runs_the_portable_implementation() -> None:
    class Indexer:
        def _forward_impl(self, *args):
            return ("impl", args)

    got = q4.qsa_indexer_forward_native(_unreachable, Indexer(), "h", "p", "fb", "meta")
    assert got == ("impl", ("h", "p", "fb", "meta"))
