"""Batched decode / verify attention (server/cpu/batched_attention.py) against the per-request loop it replaces."""

from __future__ import annotations

import pytest
import torch

from sglang_specopd.server.cpu.batched_attention import (
    batched_decode_attention,
    batched_verify_attention,
    padded_groups,
)
from sglang_specopd.server.cpu.fused_decode import extension, fused_decode_attention, fused_verify_attention


def _pool(bs, lens, hkv, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    pool_tokens = sum(lens) + 64
    k_cache = torch.randn(pool_tokens, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(pool_tokens, hkv, d, generator=g).to(dtype)
    max_ctx = max(lens) + 32
    # rows past a request's length hold slots of other requests (as a reused req_to_token row does)
    req_to_token = torch.randint(0, pool_tokens, (bs + 3, max_ctx), generator=g, dtype=torch.int32)
    perm = torch.randperm(pool_tokens, generator=g)
    rows = torch.randperm(bs + 3, generator=g)[:bs]
    start = 0
    for b, n in enumerate(lens):
        req_to_token[rows[b], :n] = perm[start:start + n].to(torch.int32)
        start += n
    return k_cache, v_cache, req_to_token, rows


def _loop(q_rows, k_cache, v_cache, req_to_token, rows, kv_lens, q_pos, scale, gqa, causal):
    """Reference: one SDPA call per request (SGLang's loop). q_rows: list of [n_b, H, D]; q_pos: list of [n_b]."""
    outs = []
    for b, q in enumerate(q_rows):
        idx = req_to_token[rows[b], : kv_lens[b]].long()
        kk = k_cache[idx].transpose(0, 1)[None].to(q.dtype)
        vv = v_cache[idx].transpose(0, 1)[None].to(q.dtype)
        mask = None
        if causal:
            mask = torch.arange(kv_lens[b])[None, :] <= q_pos[b][:, None]
        o = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1)[None], kk, vv, attn_mask=mask,
                                                             scale=scale, enable_gqa=gqa)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("fused", ["1", "0"])
@pytest.mark.parametrize("lens", [[1], [7, 7, 7], [3, 50, 9, 120, 2], [300, 1, 1, 1, 299, 64]])
@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 16), (9, 3, 64), (8, 1, 32)])
def test_decode_matches_per_request_loop(lens, hq, hkv, d, fused, monkeypatch) -> None:
    """Both float32 paths: the fused C++ kernel (server/cpu/fused_decode.py) and the batched torch one."""
    monkeypatch.setenv("SPECOPD_CPU_FUSED_DECODE", fused)
    bs = len(lens)
    k_cache, v_cache, r2t, rows = _pool(bs, lens, hkv, d, torch.float32, seed=sum(lens) + hq)
    q = torch.randn(bs, hq, d, generator=torch.Generator().manual_seed(1))
    out = torch.full((bs, hq, d), float("nan"))
    got = batched_decode_attention(q, k_cache, v_cache, r2t, rows, torch.tensor(lens), 0.125, hq != hkv, out)
    ref = _loop([q[b:b + 1] for b in range(bs)], k_cache, v_cache, r2t, rows, lens, None, 0.125, hq != hkv, False)
    assert got is out
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("fused", ["1", "0"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pre,block", [([0, 5, 40], 4), ([100, 3, 3, 250], 8), ([17], 1)])
def test_verify_matches_per_request_loop(pre, block, causal, fused, monkeypatch) -> None:
    """Both float32 paths: the fused C++ kernel (fused_decode.fused_verify_attention) and the batched torch one."""
    monkeypatch.setenv("SPECOPD_CPU_FUSED_DECODE", fused)
    bs, hq, hkv, d = len(pre), 9, 3, 64
    lens = [p + block for p in pre]
    k_cache, v_cache, r2t, rows = _pool(bs, lens, hkv, d, torch.float32, seed=7 + block)
    q = torch.randn(bs * block, hq, d, generator=torch.Generator().manual_seed(2))
    out = torch.empty(bs * block, hq, d)
    batched_verify_attention(q, k_cache, v_cache, r2t, rows, torch.tensor(pre), block, causal, None, True, out)
    q_rows = [q[b * block:(b + 1) * block] for b in range(bs)]
    q_pos = [p + torch.arange(block) for p in pre]
    ref = _loop(q_rows, k_cache, v_cache, r2t, rows, lens, q_pos, None, True, causal)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


def test_bf16_decode_close_to_loop() -> None:
    lens = [33, 200, 5]
    k_cache, v_cache, r2t, rows = _pool(3, lens, 3, 64, torch.bfloat16, seed=3)
    q = torch.randn(3, 9, 64).to(torch.bfloat16)
    out = torch.empty(3, 9, 64, dtype=torch.bfloat16)
    batched_decode_attention(q, k_cache, v_cache, r2t, rows, torch.tensor(lens), None, True, out)
    ref = _loop([q[b:b + 1] for b in range(3)], k_cache, v_cache, r2t, rows, lens, None, None, True, False)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_padded_groups_cover_every_request_once_and_bound_padding() -> None:
    lens = [5, 900, 6, 7, 1000, 8, 40, 950, 5]
    groups = padded_groups(lens, slack=1.25)
    assert sorted(i for g in groups for i in g) == list(range(len(lens)))
    for g in groups:
        glen = [lens[i] for i in g]
        assert len(g) * max(glen) <= 1.25 * sum(glen) + max(glen)
    # the five short requests share one group; the 40-token one joins the long ones (its padding is within the
    # one-request allowance), so two SDPA calls instead of nine
    assert [sorted(g) for g in groups] == [[0, 2, 3, 5, 8], [1, 4, 6, 7]]
    assert padded_groups([]) == []
    assert padded_groups([10, 10, 10, 10]) == [[0, 1, 2, 3]]
    assert [len(g) for g in padded_groups([100] * 10, max_rows=300)] == [3, 3, 3, 1]


def test_switch_off_runs_one_request_per_call(monkeypatch) -> None:
    import sglang_specopd.server.cpu.batched_attention as ba

    calls = []
    real = ba._attend

    def counting(q, *a, **k):
        calls.append(q.shape[0])
        return real(q, *a, **k)

    pre, block = [4, 9, 2], 3
    lens = [p + block for p in pre]
    k_cache, v_cache, r2t, rows = _pool(3, lens, 2, 8, torch.float32, seed=11)
    q = torch.randn(9, 4, 8)
    monkeypatch.setenv("SPECOPD_CPU_FUSED_DECODE", "0")  # the batched torch path (the fused kernel has no groups)
    monkeypatch.setattr(ba, "_attend", counting)
    on = ba.batched_verify_attention(q, k_cache, v_cache, r2t, rows, torch.tensor(pre), block, True, None, True,
                                     torch.empty(9, 4, 8))
    assert calls == [3]
    calls.clear()
    monkeypatch.setenv(ba.ENV_SWITCH, "0")
    off = ba.batched_verify_attention(q, k_cache, v_cache, r2t, rows, torch.tensor(pre), block, True, None, True,
                                      torch.empty(9, 4, 8))
    assert calls == [1, 1, 1]
    torch.testing.assert_close(on, off, atol=2e-6, rtol=1e-5)
    sentinel = object()
    assert ba.torch_native_decode(lambda *a, **k: sentinel, None, q[:3], None, k_cache, v_cache, r2t, rows,
                                  torch.tensor(lens)) is sentinel


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_fused_decode_reads_strided_queries_and_both_index_dtypes(index_dtype) -> None:
    """SGLang passes q as a view of [bs, H*D] and req_to_token as int32 (or int64): the kernel takes them as they
    come, and writes only ``out``."""
    if extension() is None:
        pytest.fail("the fused decode extension did not build (a C++ compiler is part of the install)")
    lens = [5, 130, 64, 1]
    k_cache, v_cache, r2t, rows = _pool(4, lens, 3, 64, torch.float32, seed=11)
    r2t = r2t.to(index_dtype)
    wide = torch.randn(4, 2 * 9 * 64, generator=torch.Generator().manual_seed(5))
    q = wide[:, : 9 * 64].view(4, 9, 64)  # rows strided by 2 * H * D
    assert not q.is_contiguous()
    k_before = k_cache.clone()
    out = torch.full((4, 9, 64), float("nan"))
    assert fused_decode_attention(q, k_cache, v_cache, r2t, rows, torch.tensor(lens), None, out)
    ref = _loop([q[b:b + 1] for b in range(4)], k_cache, v_cache, r2t.to(torch.int32), rows, lens, None, None,
                True, False)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    assert torch.equal(k_cache, k_before)


@pytest.mark.parametrize("causal", [True, False])
def test_fused_verify_reads_strided_queries_and_int64_slots(causal) -> None:
    """The verify block through the fused kernel itself (not the torch fallback): q a strided view, int64
    req_to_token, prefixes of 0 and past 100 tokens; equal to SGLang's per-request loop."""
    if extension() is None:
        pytest.fail("the fused decode extension did not build (a C++ compiler is part of the install)")
    pre, block, hq, hkv, d = [0, 131, 7], 5, 9, 3, 64
    lens = [p + block for p in pre]
    k_cache, v_cache, r2t, rows = _pool(3, lens, hkv, d, torch.float32, seed=13)
    wide = torch.randn(3 * block, 2 * hq * d, generator=torch.Generator().manual_seed(6))
    q = wide[:, : hq * d].view(3 * block, hq, d)
    out = torch.full((3 * block, hq, d), float("nan"))
    assert fused_verify_attention(q, k_cache, v_cache, r2t.long(), rows, torch.tensor(pre), block, causal, None, out)
    q_rows = [q[b * block:(b + 1) * block] for b in range(3)]
    ref = _loop(q_rows, k_cache, v_cache, r2t, rows, lens, [p + torch.arange(block) for p in pre], None, True, causal)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


def test_fused_decode_declines_what_it_does_not_handle(monkeypatch) -> None:
    """bf16 tensors and the env switch leave ``out`` untouched and return False (the torch path runs instead)."""
    lens = [4, 9]
    k_cache, v_cache, r2t, rows = _pool(2, lens, 3, 64, torch.bfloat16, seed=12)
    q = torch.randn(2, 9, 64).to(torch.bfloat16)
    out = torch.zeros(2, 9, 64, dtype=torch.bfloat16)
    assert not fused_decode_attention(q, k_cache, v_cache, r2t, rows, torch.tensor(lens), None, out)
    assert torch.count_nonzero(out) == 0
    monkeypatch.setenv("SPECOPD_CPU_FUSED_DECODE", "0")
    k32, v32, q32 = k_cache.float(), v_cache.float(), q.float()
    out32 = torch.zeros(2, 9, 64)
    assert not fused_decode_attention(q32, k32, v32, r2t, rows, torch.tensor(lens), None, out32)
    assert torch.count_nonzero(out32) == 0
