"""Batched decode and verify attention for SGLang's ``torch_native`` backend on CPU.

SGLang 0.5.23's ``TorchNativeAttnBackend`` runs one ``scaled_dot_product_attention`` call per request per layer
(``_run_sdpa_forward_decode``: "this loop process a sequence per iter, this is inefficient"); our TARGET_VERIFY
path (:func:`sglang_specopd.server.cpu.patches.torch_native_forward_extend`) did the same. On the CPU default
(SmolLM2-135M, 30 layers) at 48 requests in flight that loop was 83% of a decode step (py-spy, docs/journal.md,
session 11): 1,440 small SDPA calls and K/V gathers per step.

Here the requests of a batch are sorted by KV length and cut into groups whose padded size stays close to their
real size (:func:`padded_groups`); each group gathers its K/V once into a padded ``[g, H_kv, L_max, D]`` tensor
and runs ONE SDPA call with a boolean key mask (key ``t`` of request ``b`` is visible iff ``t < len_b``, and for
causal verify also ``t <= prefix_b + j`` for block query ``j``). Values equal the per-request loop's up to float
summation order (tests/test_cpu_batched_attention.py checks both against the loop on a grid of shapes).

``SPECOPD_CPU_BATCHED_ATTENTION=0`` in the server's environment turns it off (SGLang's loop for decode, one request
per SDPA call for verify): the A/B switch of ``benchmarks/cpu_attention.py``.
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import torch

ENV_SWITCH = "SPECOPD_CPU_BATCHED_ATTENTION"

# A group's padded K/V may exceed the sum of its real lengths by this factor (plus one request's worth).
PAD_SLACK = 1.25
# At most this many padded key rows per group (bounds the gathered K/V: rows x H_kv x D x 2 tensors).
MAX_GROUP_ROWS = 1 << 17


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


def _gather(cache: torch.Tensor, idx: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``cache[idx]`` for padded token-slot indices ``idx`` [g, L] -> [g, H_kv, L, D] in ``dtype``."""
    return cache[idx].permute(0, 2, 1, 3).to(dtype)


def batched_decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                             scaling: Optional[float], enable_gqa: bool, out: torch.Tensor) -> torch.Tensor:
    """One query token per request attends to its whole KV (decode), several requests per SDPA call.

    Args:
        query: [bs, H_q, D] (any float dtype). k_cache / v_cache: [pool_tokens, H_kv, D]. req_to_token: [max_reqs,
            max_context] int token-slot indices. req_pool_indices, seq_lens: [bs] (KV length incl. the new token).
        scaling: softmax scale (None = 1/sqrt(D)). out: [bs, H_q, D_v], written in place and returned.
    """
    lens = seq_lens.tolist()
    rows = req_pool_indices.tolist()
    for group in padded_groups(lens):
        g_len = max(int(lens[i]) for i in group)
        sel = torch.tensor(group, dtype=torch.long)
        idx = req_to_token[torch.tensor([rows[i] for i in group], dtype=torch.long), :g_len].long()
        q = query[sel].unsqueeze(2)  # [g, H_q, 1, D]
        kk, vv = _gather(k_cache, idx, q.dtype), _gather(v_cache, idx, q.dtype)
        glens = torch.tensor([int(lens[i]) for i in group])
        mask = (torch.arange(g_len)[None, :] < glens[:, None])[:, None, None, :]  # [g, 1, 1, L]
        o = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=scaling,
                                                             enable_gqa=enable_gqa)
        out[sel] = o.squeeze(2).to(out.dtype)
    return out


def batched_verify_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                             block: int, causal: bool, scaling: Optional[float], enable_gqa: bool,
                             out: torch.Tensor) -> torch.Tensor:
    """A block of ``block`` query tokens per request (TARGET_VERIFY) attends to prefix + block.

    Request ``b``'s queries are rows ``b*block .. b*block+block-1`` of ``query`` [bs*block, H_q, D], at positions
    ``prefix_b + j``; its KV is the first ``prefix_b + block`` slots of its ``req_to_token`` row. ``causal``: query
    ``j`` sees keys ``0 .. prefix_b + j`` (the target's chain verify); otherwise the whole prefix + block (DFlash's
    ENCODER_ONLY draft layers). ``out`` [bs*block, H_q, D_v] is written in place and returned.
    """
    pre = prefix_lens.tolist()
    rows = req_pool_indices.tolist()
    lens = [int(p) + block for p in pre]
    hq, d = query.shape[1], query.shape[2]
    qb = query.view(len(pre), block, hq, d)
    ob = out.view(len(pre), block, out.shape[1], out.shape[2])
    for group in padded_groups(lens, max_rows=MAX_GROUP_ROWS if enabled() else 0):
        g_len = max(lens[i] for i in group)
        sel = torch.tensor(group, dtype=torch.long)
        idx = req_to_token[torch.tensor([rows[i] for i in group], dtype=torch.long), :g_len].long()
        q = qb[sel].transpose(1, 2)  # [g, H_q, block, D]
        kk, vv = _gather(k_cache, idx, q.dtype), _gather(v_cache, idx, q.dtype)
        pos = torch.arange(g_len)
        glens = torch.tensor([lens[i] for i in group])
        mask = (pos[None, None, :] < glens[:, None, None]).expand(len(group), block, g_len)
        if causal:
            gpre = torch.tensor([int(pre[i]) for i in group])
            qpos = gpre[:, None] + torch.arange(block)[None, :]  # [g, block]
            mask = mask & (pos[None, None, :] <= qpos[:, :, None])
        o = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask[:, None], scale=scaling,
                                                             enable_gqa=enable_gqa)
        ob[sel] = o.transpose(1, 2).to(out.dtype)
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
