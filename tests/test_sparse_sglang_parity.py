"""The QSA selection reference (specopd_kernels.sparse) against the installed SGLang 0.5.23's own torch path of the
Qwen4-Exp indexer: block compression (``average_pool_qsa_keys``, ``GemmaRMSNorm``, the layer's RoPE), scoring
(``torch_qsa_mqa_prefill``), top-k (``qsa_fast_topk`` CPU path), expansion with the tail
(``torch_expand_qsa_block_indices``) and the sparse attention (``qsa_sparse_attention_reference``). Kept apart from
tests/test_sparse_kernels.py because importing SGLang takes ~10-30 s here; the kernels never import it."""

from types import SimpleNamespace

import pytest
import torch

from specopd_kernels.sparse import QSAConfig, qsa_block_keys, qsa_select_sequence_naive, sparse_attention_naive

sgl_kernel = pytest.importorskip("sglang.srt.layers.attention.qsa.kernel")
sgl_mqa = pytest.importorskip("sglang.srt.layers.attention.qsa.mqa")
sgl_meta = pytest.importorskip("sglang.srt.layers.attention.qsa.metadata")


@pytest.mark.parametrize("length,ratio,block_topk,rotary_dim", [(40, 4, 2, 16), (23, 2, 3, 32), (9, 2, 8, 0)])
def test_selection_and_attention_match_sglang_torch_path(length, ratio, block_topk, rotary_dim):
    from sglang.srt.layers.layernorm import GemmaRMSNorm
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
    from sglang.srt.layers.rotary_embedding.utils import apply_rotary_emb

    hi, di = 8, 32
    gen = torch.Generator().manual_seed(length)
    weight = 0.2 * torch.randn(di, generator=gen)
    cfg = QSAConfig(budget=ratio * block_topk, compress_ratio=ratio, k_norm_weight=weight, norm_eps=1e-6,
                    rotary_dim=rotary_dim, rope_theta=10000.0)
    iq, ik = torch.randn(length, hi, di, generator=gen), torch.randn(length, 1, di, generator=gen)
    nb = length // ratio
    # SGLang's compression of the complete blocks (qsa_indexer.py update_key_state_and_compress, non-fused path)
    pooled = sgl_kernel.average_pool_qsa_keys(ik[: nb * ratio].reshape(nb, ratio, 1, di))
    norm = GemmaRMSNorm(di, eps=1e-6)
    norm.weight.data.copy_(weight)
    keys = norm.forward_native(pooled.reshape(nb, di))
    first = torch.arange(nb) * ratio
    if rotary_dim:  # the layer's fp32 cos / sin cache, applied as QSAIndexer.apply_rope does
        stub = SimpleNamespace(rotary_dim=rotary_dim, base=10000, position_start=0, max_position_embeddings=256,
                               _force_native=False)
        stub._compute_inv_freq = lambda base: RotaryEmbedding._compute_inv_freq(stub, base)
        cos, sin = RotaryEmbedding._compute_cos_sin_cache(stub)[first].chunk(2, -1)
        rot = apply_rotary_emb(keys[:, None, :rotary_dim], cos, sin, True)[:, 0]
        keys = torch.cat([rot, keys[:, rotary_dim:]], -1)
    torch.testing.assert_close(qsa_block_keys(ik[: nb * ratio].reshape(nb, ratio, di), first, cfg), keys,
                               atol=1e-5, rtol=1e-5)
    # SGLang's prefill selection over one sequence (every row sees blocks 0 .. (p + 1) // r - 1)
    starts, ends, _ = sgl_meta.build_qsa_row_ranges(torch.tensor([length]), torch.arange(length),
                                                    torch.zeros(length, dtype=torch.long), ratio)
    logits = sgl_mqa.torch_qsa_mqa_prefill(iq, keys[:, None, :], starts, ends)
    blocks = sgl_kernel.qsa_fast_topk(logits, starts, ends, topk=block_topk)
    want = sgl_kernel.torch_expand_qsa_block_indices(blocks, torch.arange(length), torch.full((length,), length),
                                                     ratio, cfg.budget).long()
    got = qsa_select_sequence_naive(iq, ik, cfg)
    assert got.shape == want.shape == (length, cfg.width)
    for row in range(length):  # same sets (SGLang's CPU top-k does not fix the order)
        assert sorted(got[row][got[row] >= 0].tolist()) == sorted(want[row][want[row] >= 0].tolist()), row
    assert int((got >= 0).sum(1).min()) >= 1
    q = torch.randn(length, 4, 16, generator=gen)
    k, v = torch.randn(length, 2, 16, generator=gen), torch.randn(length, 2, 16, generator=gen)
    torch.testing.assert_close(sparse_attention_naive(q, k, v, got),
                               sgl_kernel.qsa_sparse_attention_reference(q, k, v, want), atol=1e-5, rtol=1e-5)
