"""Pure-torch stand-in for the CUDA-only ``sgl_kernel`` wheel, used ONLY when SGLang runs on a CPU device.

SGLang's CPU engine imports a handful of ``*_cpu`` ops from ``sgl_kernel`` at import time; the PyPI
``sglang-kernel`` wheel is CUDA-only and the official CPU build targets AMX Xeons. ``specopd serve`` puts this
directory first on ``PYTHONPATH`` of the server process when ``--device cpu``; it is never used on GPU.

Only the ops SGLang's CPU path calls are implemented; any other attribute raises ``AttributeError`` so that
``hasattr(sgl_kernel, ...)`` checks in SGLang stay honest and fall back to their torch paths.
Semantics follow the Triton kernels they replace (sglang/srt/mem_cache/allocation.py
``assign_req_to_token_pool``, sglang/kernels/ops/speculative/cache_locs.py ``assign_extend_cache_locs`` /
``assign_draft_cache_locs_contiguous``, sglang/kernels/ops/kvcache/cache_move.py ``copy_all_layer_kv_cache_tiled``).
The Gated DeltaNet ops of hybrid targets (Qwen3-Next) live in :mod:`sgl_kernel.mamba` (``torch.ops.sgl_kernel``
registrations in ``_torch_ops``).
"""

from __future__ import annotations

import ctypes

import torch

from . import _torch_ops, mamba  # noqa: F401  (GDN ops of hybrid targets; registers torch.ops.sgl_kernel.*)

__version__ = "0.0.0+specopd.cpu.standin"
SPECOPD_CPU_STANDIN = True


def _segments(start_offset: torch.Tensor, end_offset: torch.Tensor):
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    out = 0
    for s, e in zip(starts, ends):
        yield int(s), int(e), out
        out += int(e) - int(s)


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """req_to_token[req_pool_indices[i], start[i]:end[i]] = out_cache_loc[packed segment i] (in place)."""
    rows = req_pool_indices.tolist()
    for row, (s, e, o) in zip(rows, _segments(start_offset, end_offset)):
        if e > s:
            req_to_token[int(row), s:e] = out_cache_loc[o : o + e - s].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """out_cache_loc[packed segment i] = req_to_token[req_pool_indices[i], start[i]:end[i]] (in place)."""
    rows = req_pool_indices.tolist()
    for row, (s, e, o) in zip(rows, _segments(start_offset, end_offset)):
        if e > s:
            out_cache_loc[o : o + e - s] = req_to_token[int(row), s:e].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_cols):
    """out_cache_loc[i*topk*num_cols : (i+1)*topk*num_cols] = req_to_token[row_i, seq_lens[i] : + topk*num_cols]."""
    n = int(topk) * int(num_cols)
    for i, (row, start) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * n : (i + 1) * n] = req_to_token[int(row), int(start) : int(start) + n].to(out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every buffer b (raw pointer data_ptrs[b], row stride strides[b] bytes): row tgt_loc[j] <- row src_loc[j].

    Rows are read before any is written (like the tiled Triton kernel, safe for overlapping src/tgt sets).
    """
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        base, stride = int(base), int(stride)
        rows = [ctypes.string_at(base + int(s) * stride, stride) for s in src_loc.tolist()]
        for t, data in zip(tgt_loc.tolist(), rows):
            ctypes.memmove(base + int(t) * stride, data, stride)


def _not_on_cpu(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: EAGLE/tree speculative ops are not provided by sglang-specopd's CPU stand-in "
            "(DFLASH/SPECOPD verify chains and never calls it)"
        )

    op.__name__ = name
    return op


# Imported at module import time by SGLang's EAGLE/tree modules on the CPU engine, never called by DFLASH/SPECOPD.
for _name in ("build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu", "fill_accept_out_cache_loc_cpu",
              "fill_bonus_tokens_cpu", "rotate_input_ids_cpu"):
    globals()[_name] = _not_on_cpu(_name)
del _name


def __getattr__(name: str):
    raise AttributeError(
        f"sgl_kernel.{name} is not available: this is sglang-specopd's pure-torch CPU stand-in "
        "(only the ops SGLang's CPU engine needs are provided)"
    )
