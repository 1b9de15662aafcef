"""A two-group pending ring for QSA index keys, so speculative verify on Qwen4-Exp targets is exact (adaptation 14).

SGLang 0.5.23 keeps the index keys of a QSA layer's incomplete block ("group" of ``r = compress_ratio`` tokens) in
a per-request ring of ``r`` slots, ``req_pool_idx * r + position % r`` (``qsa/metadata.py``), and compresses a
group from the ring once its last token is stored. A verify forward stores all its rows before compressing, and
its ``n <= r`` rows (the check in ``QwenSparseAttnBackend._require_chain_speculation``) can straddle a group end:
rows 91..94 with ``r = 4`` complete the group 88..91 at row 91, but rows 92, 93, 94 have already overwritten the
slots of 88, 89, 90. The group is compressed from the wrong keys, the row at 91 selects other blocks than plain
decoding does, and greedy speculative decoding diverges from plain serving in the sparse regime (measured in
session 17 on ``tiny-qwen4exp-sparse`` with a block-4 SPECOPD drafter: block 22 missing from the anchor row's
selection at position 91; the third generated token differed). Rejected draft rows also overwrite committed
members of the pending group for the next forward.

With ``2r`` slots per request (``req_pool_idx * 2r + position % 2r``) neither happens: a forward's rows and the
members of every group it completes span at most ``n + r - 1 <= 2r - 1`` positions, and rejected rows of the last
forward lie within ``2r - 2`` positions after any committed member still pending. Three changes, all here:
:func:`pending_ring_slots` and :func:`group_ring_slots` replace SGLang's two slot builders where they are called
(``qsa_indexer`` and ``qwen_sparse_attn_backend`` import them by name), and :func:`widen_ring_buffers` reallocates
the pool's ring buffers (index keys per full-attention layer, RoPE coordinates) at twice the rows after
``QSATokenToKVPool.__init__``. Registered on the CPU engine only: a GPU server also runs CUDA-graph and fused
paths that address the ring themselves, which this does not cover (unverified there).
"""

from __future__ import annotations

import torch

RING_GROUPS = 2  # pending-ring slots per request, in groups of compress_ratio


def pending_ring_slots(*, token_to_batch_idx: torch.Tensor, req_pool_indices: torch.Tensor,
                       sequence_lengths: torch.Tensor, logical_positions: torch.Tensor, compress_ratio: int,
                       is_extend: bool) -> torch.Tensor:
    """Ring slot per token: ``req_pool_idx * 2r + position % 2r`` (SGLang: ``* r + % r``). On extend, tokens
    before the pending tail go to the inert dump rows ``[0, 2r)`` of request slot 0 (never allocated), as SGLang's.

    Args: as ``qsa.metadata.build_pending_ring_slots`` (token_to_batch_idx [T] row -> request; req_pool_indices
    [S]; sequence_lengths [S]; logical_positions [T] int). Returns int64 [T]."""
    ring = RING_GROUPS * compress_ratio
    rows = token_to_batch_idx.long()[: logical_positions.numel()]
    positions = logical_positions.long()
    slots = req_pool_indices.long()[rows] * ring + positions % ring
    if is_extend:
        lengths = sequence_lengths.long()[rows]
        pending = positions >= (lengths // compress_ratio) * compress_ratio
        slots = torch.where(pending, slots, positions % ring)
    return slots


def group_ring_slots(*, req_pool_indices: torch.Tensor, group_end_positions: torch.Tensor,
                     sequence_ids: torch.Tensor, compress_ratio: int) -> torch.Tensor:
    """Ring slots of each planned group's ``r`` members, oldest first (``qsa.metadata.build_group_ring_slots`` on
    the two-group ring). group_end_positions, sequence_ids: [G]. Returns int64 [G, r]."""
    ring = RING_GROUPS * compress_ratio
    requests = req_pool_indices.long()[sequence_ids]
    offsets = torch.arange(compress_ratio - 1, -1, -1, device=group_end_positions.device, dtype=torch.long)
    positions = (group_end_positions[:, None] - offsets[None, :]).clamp_min(0)
    return requests[:, None] * ring + positions % ring


def widen_ring_buffers(original_fn, self, *args, **kwargs):
    """AROUND hook for ``QSATokenToKVPool.__init__``: after SGLang's constructor, the pending-ring buffers
    (``qsa_key_state_buffer_pool``: one ``[slots, heads, D]`` per full-attention layer; ``qsa_rope_position_buffer``
    ``[slots, 3]``) are reallocated, zeroed, with :data:`RING_GROUPS` times the rows."""
    result = original_fn(self, *args, **kwargs)
    rows = self.qsa_num_request_slots * self.qsa_compress_ratio * RING_GROUPS
    self.qsa_key_state_buffer_pool = [b.new_zeros((rows, *b.shape[1:])) for b in self.qsa_key_state_buffer_pool]
    rope = self.qsa_rope_position_buffer
    self.qsa_rope_position_buffer = rope.new_zeros((rows, *rope.shape[1:]))
    return result


def register_qsa_ring() -> None:
    """Register adaptation 14 (CPU engine only)."""
    from sglang_specopd.server import compat

    compat.hook("QSATokenToKVPool.__init__", widen_ring_buffers)
    compat.patch("qsa_indexer.build_pending_ring_slots", pending_ring_slots)
    compat.patch("qsa_indexer.build_group_ring_slots", group_ring_slots)
    compat.patch("qwen_sparse_attn_backend.build_pending_ring_slots", pending_ring_slots)
    compat.patch("qwen_sparse_attn_backend.build_group_ring_slots", group_ring_slots)
