"""Batched decode and verify attention for SGLang's ``torch_native`` backend on CPU.

SGLang 0.5.23's ``TorchNativeAttnBackend`` runs one ``scaled_dot_product_attention`` call per request per layer
(``_run_sdpa_forward_decode``: "this loop process a sequence per iter, this is inefficient"); our TARGET_VERIFY
path (:func:`sglang_specopd.server.cpu.patches.torch_native_forward_extend`) did the same. On the CPU default
(SmolLM2-135M, 30 layers) at 48 requests in flight that loop was 83% of a decode step (py-spy, docs/journal.md,
session 11): 1,440 small SDPA calls and K/V gathers per step.

Here the requests of a batch are sorted by KV length and cut into groups whose padded size stays close to their
real size (:func:`padded_groups`); each group gathers its K/V once with ``index_select`` into a padded
``[g, H_kv, L_max, D]`` tensor (:func:`_gather`) and runs one grouped-query attention as two float32 matmuls with
a boolean key mask (:func:`_attend`: key ``t`` of request ``b`` is visible iff ``t < len_b``, and for causal
verify also ``t <= prefix_b + j`` for block query ``j``). Both halves matter on this CPU: advanced indexing and
bf16 SDPA were each ~35 ms per layer at 48 requests x ~750 tokens, ``index_select`` and the matmuls 2-4 ms and
~9 ms. Values equal the per-request loop's up to float summation order (tests/test_cpu_batched_attention.py
checks both against the loop on a grid of shapes; bf16 inputs are attended in float32, so closer to exact).

``SPECOPD_CPU_BATCHED_ATTENTION=0`` in the server's environment turns it off (SGLang's loop for decode, one request
per attention call for verify): the A/B switch of ``benchmarks/cpu_attention.py``.
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import torch

from .fused_decode import fused_decode_attention, fused_verify_attention

ENV_SWITCH = "SPECOPD_CPU_BATCHED_ATTENTION"

# A group's padded K/V may exceed the sum of its real lengths by this factor (plus one request's worth).
PAD_SLACK = 1.25
# At most this many padded key rows per group: the gathered K/V of a group should stay in cache (48 decode requests
# x ~750 tokens in bf16: 38.6 ms per layer with one group of 128k rows, 8.6 ms with groups of 4,096; session 11).
MAX_GROUP_ROWS = 4096


def enabled() -> bool:
    """False when ``SPECOPD_CPU_BATCHED_ATTENTION=0`` (read at each call: cheap, and tests can flip it)."""
    return os.environ.get(ENV_SWITCH, "1") != "0"


def padded_groups(lengths: Sequence[int], slack: float = PAD_SLACK, max_rows: int = MAX_GROUP_ROWS) -> List[List[int]]:
    """Cut request indices into groups, each run as one padded attention call.

    Requests are taken in increasing length; a group is closed when adding the next request would make
    ``size * max_len`` (the padded rows) exceed ``slack * sum(lengths) + max_len`` or ``max_rows``.

    Args:
        lengths: KV length per request (tokens), any order. Returns: lists of indices into ``lengths``, every
            index exactly once; a request longer than ``max_rows`` gets a group of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: int(lengths[i]))
    groups: List[List[int]] = []
    cur: List[int] = []
    total = 0
    for i in order:
        n = int(lengths[i])
        if cur:
            rows = (len(cur) + 1) * n  # n is the group's new max (sorted order)
            if rows > slack * (total + n) + n or rows > max_rows:
                groups.append(cur)
                cur, total = [], 0
        cur.append(i)
        total += n
    if cur:
        groups.append(cur)
    return groups


def _gather(cache: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """K or V rows of padded token-slot indices ``idx`` [g, L] -> [g, H_kv, L, D] (contiguous).

    ``index_select`` on the flattened cache: ~10x faster on CPU than ``cache[idx]`` (advanced indexing), which
    SGLang's loop uses (bf16, 48 requests x ~750 tokens: 2-4 ms vs 34 ms per layer, session 11).
    """
    g, n = idx.shape
    rows = cache.view(cache.shape[0], -1).index_select(0, idx.reshape(-1))
    return rows.view(g, n, cache.shape[1], cache.shape[2]).transpose(1, 2).contiguous()


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
            scale: Optional[float]) -> torch.Tensor:
    """Grouped-query attention with two float32 matmuls and a float32 softmax.

    q: [g, H_q, n, D]; k, v: [g, H_kv, L, D] (H_q a multiple of H_kv; query head h reads kv head h // (H_q/H_kv),
    as SDPA's ``enable_gqa``); mask: bool [g, n, L] (True = visible) or None. Returns [g, H_q, n, D_v] in q's dtype.
    On this CPU ``scaled_dot_product_attention`` in bf16 with a mask took 32-38 ms per layer for 48 decode queries
    where this takes ~9 ms (session 11 microbenchmark): the win comes from here and from :func:`_gather`.
    """
    g, hq, n, d = q.shape
    hkv = k.shape[1]
    qg = q.reshape(g, hkv, (hq // hkv) * n, d).float()  # heads h = kv * G + j: contiguous groups of G query heads
    s = torch.matmul(qg, k.float().transpose(-1, -2)) * (d ** -0.5 if scale is None else scale)  # [g, hkv, G*n, L]
    if mask is not None:
        s = s.view(g, hkv, hq // hkv, n, -1).masked_fill(~mask[:, None, None], float("-inf")).view_as(s)
    o = torch.matmul(s.softmax(-1), v.float())  # [g, hkv, G*n, D_v]
    return o.view(g, hq, n, -1).to(q.dtype)


def batched_decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                             scaling: Optional[float], enable_gqa: bool, out: torch.Tensor) -> torch.Tensor:
    """One query token per request attends to its whole KV (decode), several requests per SDPA call.

    Args:
        query: [bs, H_q, D] (any float dtype). k_cache / v_cache: [pool_tokens, H_kv, D]. req_to_token: [max_reqs,
            max_context] int token-slot indices. req_pool_indices, seq_lens: [bs] (KV length incl. the new token).
        scaling: softmax scale (None = 1/sqrt(D)). out: [bs, H_q, D_v], written in place and returned.
    Float32 tensors go to the fused C++ kernel (:mod:`.fused_decode`: no gather, no padding) where it builds.
    """
    if fused_decode_attention(query, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, scaling, out):
        return out
    lens = seq_lens.tolist()
    for group, sel in _groups(lens):
        g_len = max(int(lens[i]) for i in group)
        idx = req_to_token[req_pool_indices if sel is None else req_pool_indices[sel], :g_len].long()
        q = (query if sel is None else query[sel]).unsqueeze(2)  # [g, H_q, 1, D]
        o = _attend(q, _gather(k_cache, idx), _gather(v_cache, idx), _key_mask([int(lens[i]) for i in group], g_len),
                    scaling)
        _write(out, sel, o.squeeze(2))
    return out


def _groups(lens: Sequence[int], max_rows: Optional[int] = None):
    """(group indices, index tensor or None) per padded group; None when one group holds every request in order
    (the common small-batch case: no gather / scatter of queries and outputs)."""
    groups = padded_groups(lens, max_rows=MAX_GROUP_ROWS if max_rows is None else max_rows)
    if len(groups) == 1:
        return [(list(range(len(lens))), None)]
    return [(g, torch.tensor(g, dtype=torch.long)) for g in groups]


def _key_mask(glens: List[int], g_len: int) -> Optional[torch.Tensor]:
    """[g, 1, L] bool key-padding mask, or None when every request of the group has length ``g_len``."""
    if min(glens) == g_len:
        return None
    return (torch.arange(g_len)[None, :] < torch.tensor(glens)[:, None])[:, None, :]


def _write(out: torch.Tensor, sel: Optional[torch.Tensor], value: torch.Tensor) -> None:
    if sel is None:
        out.copy_(value)
    else:
        out[sel] = value.to(out.dtype)


def batched_verify_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                             block: int, causal: bool, scaling: Optional[float], enable_gqa: bool,
                             out: torch.Tensor) -> torch.Tensor:
    """A block of ``block`` query tokens per request (TARGET_VERIFY) attends to prefix + block.

    Request ``b``'s queries are rows ``b*block .. b*block+block-1`` of ``query`` [bs*block, H_q, D], at positions
    ``prefix_b + j``; its KV is the first ``prefix_b + block`` slots of its ``req_to_token`` row. ``causal``: query
    ``j`` sees keys ``0 .. prefix_b + j`` (the target's chain verify); otherwise the whole prefix + block (DFlash's
    ENCODER_ONLY draft layers). ``out`` [bs*block, H_q, D_v] is written in place and returned.
    Float32 tensors go to the fused C++ kernel (:func:`.fused_decode.fused_verify_attention`) where it builds.
    """
    if fused_verify_attention(query, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, block, causal,
                              scaling, out):
        return out
    pre = prefix_lens.tolist()
    lens = [int(p) + block for p in pre]
    hq, d = query.shape[1], query.shape[2]
    qb = query.view(len(pre), block, hq, d)
    ob = out.view(len(pre), block, out.shape[1], out.shape[2])
    for group, sel in _groups(lens, max_rows=None if enabled() else 0):
        g_len = max(lens[i] for i in group)
        idx = req_to_token[req_pool_indices if sel is None else req_pool_indices[sel], :g_len].long()
        q = (qb if sel is None else qb[sel]).transpose(1, 2)  # [g, H_q, block, D]
        pos = torch.arange(g_len)
        glens = torch.tensor([lens[i] for i in group])
        mask = (pos[None, None, :] < glens[:, None, None]).expand(len(group), block, g_len)
        if causal:
            gpre = torch.tensor([int(pre[i]) for i in group])
            qpos = gpre[:, None] + torch.arange(block)[None, :]  # [g, block]
            mask = mask & (pos[None, None, :] <= qpos[:, :, None])
        o = _attend(q, _gather(k_cache, idx), _gather(v_cache, idx), mask, scaling)
        _write(ob, sel, o.transpose(1, 2))
    return out


def torch_native_decode(original_fn, self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        encoder_lens=None, scaling=None, enable_gqa=False, causal=False, is_cross_attn=False,
                        sliding_window_size=None):
    """AROUND hook for ``TorchNativeAttnBackend._run_sdpa_forward_decode``: batched on CPU.

    Falls back to SGLang's loop for anything but plain self-attention decode on CPU (encoder lengths, cross
    attention, a sliding window, a GPU tensor). ``query``/``output``: [bs, H, D] as SGLang passes them.
    """
    if (not enabled() or query.device.type != "cpu" or encoder_lens is not None or is_cross_attn
            or (sliding_window_size is not None and sliding_window_size > -1) or query.shape[0] != seq_lens.shape[0]):
        return original_fn(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                           encoder_lens, scaling=scaling, enable_gqa=enable_gqa, causal=causal,
                           is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
    return batched_decode_attention(query, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, scaling,
                                    enable_gqa, output)
