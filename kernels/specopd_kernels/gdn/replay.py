"""Indexed state replay: score a packed proposal-tree row through a GDN layer's core without re-running the prefix
per node (plain torch; forward only, not written for autograd).

/work/shared/notes/algorithms.md "Gated DeltaNet (linear attention) and indexed state replay":
  1. conv: every row's conv window is gathered by index (:meth:`GDNTreeLayout.conv_index`): prefix rows see the
     previous W - 1 prefix tokens (or the initial window), node rows their ancestors then prefix tokens
     ``anchor, anchor - 1, ...``: the node's "own conv window over its ancestor chain", no per-branch copy. The
     window at a chunk boundary is the same gather, so boundary windows cost nothing to keep.
  2. prefix: one chunked pass (:func:`~specopd_kernels.gdn.chunk.gdn_chunk_prepared`, chunk C, default 64) gives
     the prefix outputs and the states at the chunk boundaries 0, C, 2C, ...
  3. anchors: the state after token a is replayed from boundary ``(a + 1) // C`` over the <= C - 1 tokens up to
     a, all distinct anchors at once (right-aligned token loop); anchor -1 is the initial state.
  4. nodes, level by level (depth 0 from the anchor states, depth d from the parents' states at depth d - 1,
     gathered by index, so siblings share their parent's state); only one level of states is held:
     memory max_level_width x HV x Dv x Dk fp32 (the Triton kernel, :mod:`.triton_replay`, holds none).
Equals :func:`~specopd_kernels.gdn.naive.gdn_tree_naive` (each node as its own sequence) up to fp32 rounding.
Cost: O(P) for the prefix + O(A C) anchor replay + O(N) node steps, against O(N (P + depth)) for the naive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from .chunk import DEFAULT_CHUNK, gdn_chunk_prepared
from .layer import GDNParams, GDNTreeOutput, gdn_gates, split_mixed_qkv
from .layout import GDNTreeLayout, check_gdn_row
from .naive import gdn_step, prepare_qk

__all__ = ["PrefixReplay", "conv_rows", "finish_replay", "gdn_tree_replay", "replay_anchor_states",
           "replay_prefix", "tree_nodes_torch"]


@dataclass(frozen=True, eq=False)
class PrefixReplay:
    """Everything the node pass needs, from :func:`replay_prefix` (T = P + N rows).

    q, k: [T, H, Dk], v: [T, HV, Dv] after the conv (mixed_qkv's dtype); g, beta: fp32 [T, HV]; prefix_out: fp32
    [P, HV, Dv]; anchor_states: fp32 [A, HV, Dv, Dk], the state after each of ``layout.anchors``;
    boundary_states: fp32 [P // C + 1, HV, Dv, Dk] (entry j after j * C prefix tokens) and boundary_windows:
    [P // C + 1, C_dim, W-1] the conv windows there; final_state / final_window: after the P prefix tokens.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    prefix_out: torch.Tensor
    anchor_states: torch.Tensor
    boundary_states: torch.Tensor
    boundary_windows: torch.Tensor
    final_state: torch.Tensor
    final_window: torch.Tensor


def conv_rows(mixed_qkv: torch.Tensor, window: torch.Tensor, params: GDNParams,
              layout: GDNTreeLayout) -> torch.Tensor:
    """Causal conv1d + SiLU of every row of the packed row over its own sequence (fp32 sums, tap by tap).

    mixed_qkv: [P+N, C]; window: [C, W-1] initial window. Returns [P+N, C] in mixed_qkv's dtype."""
    ext = torch.cat([window.T, mixed_qkv])  # [W-1+T, C]
    idx = layout.conv_index(params.conv_width).to(mixed_qkv.device)
    w = params.conv_weight.float()
    y = torch.zeros(mixed_qkv.shape, dtype=torch.float32, device=mixed_qkv.device)
    if params.conv_bias is not None:
        y += params.conv_bias.float()
    for j in range(params.conv_width):
        y += ext[idx[:, j]].float() * w[:, j]
    return F.silu(y).to(mixed_qkv.dtype)


def replay_anchor_states(qn: torch.Tensor, kn: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         boundary_states: torch.Tensor, anchors: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """State after prefix token a, for every a in ``anchors`` (int64 [A], in [-1, P)): from boundary state
    ``(a + 1) // C``, replay tokens ``C ((a + 1) // C) .. a`` (at most C - 1), all anchors in one right-aligned
    token loop. qn, kn: fp32 [P, HV, Dk] (prepared); v: [P, HV, Dv]; g, beta: [P, HV]; boundary_states: fp32
    [P // C + 1, HV, Dv, Dk]. Returns fp32 [A, HV, Dv, Dk]."""
    anchors = anchors.to(qn.device)
    j = torch.div(anchors + 1, chunk_size, rounding_mode="floor")
    start = j * chunk_size
    state = boundary_states[j]
    steps = int((anchors + 1 - start).max()) if anchors.numel() else 0
    for s in range(steps):
        tok = anchors - (steps - 1) + s
        active = (tok >= start)[:, None, None, None]
        t = tok.clamp(min=0)
        new, _ = gdn_step(state, qn[t], kn[t], v[t], g[t], beta[t])
        state = torch.where(active, new, state)
    return state


def replay_prefix(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, params: GDNParams,
                  layout: GDNTreeLayout, initial_state: Optional[torch.Tensor] = None,
                  initial_window: Optional[torch.Tensor] = None, chunk_size: int = DEFAULT_CHUNK) -> PrefixReplay:
    """Steps 1-3 of the module docstring: conv of all rows, gates, the chunked prefix pass and the anchor
    states. Arguments as :func:`gdn_tree_replay`. Returns :class:`PrefixReplay`."""
    state0, window0 = check_gdn_row(mixed_qkv, a, b, params, layout, initial_state, initial_window)
    p, w1 = layout.prefix_len, params.conv_width - 1
    y = conv_rows(mixed_qkv, window0, params, layout)
    q, k, v = split_mixed_qkv(y, params)
    g, beta = gdn_gates(a, b, params)
    qn, kn = prepare_qk(q[:p], k[:p], params.num_v_heads, params.q_scale, params.use_qk_l2norm)
    out, final, bounds = gdn_chunk_prepared(qn, kn, v[:p], g[:p], beta[:p], state0, chunk_size)
    anchor_states = replay_anchor_states(qn, kn, v[:p], g[:p], beta[:p], bounds, layout.anchors, chunk_size)
    ext = torch.cat([window0.T, mixed_qkv[:p]])  # boundary b's window: raw inputs b-W+1 .. b-1 = ext[b : b+W-1]
    win_idx = (torch.arange(bounds.shape[0]) * chunk_size)[:, None] + torch.arange(w1)
    return PrefixReplay(q, k, v, g, beta, out, anchor_states, bounds, ext[win_idx.to(ext.device)].transpose(1, 2),
                        final, ext[p:].T.contiguous())


def tree_nodes_torch(prep: PrefixReplay, params: GDNParams, layout: GDNTreeLayout) -> torch.Tensor:
    """Step 4 in torch, level by level. Returns the node outputs fp32 [N, HV, Dv]."""
    p, dev = layout.prefix_len, prep.v.device
    qn, kn = prepare_qk(prep.q[p:], prep.k[p:], params.num_v_heads, params.q_scale, params.use_qk_l2norm)
    v, g, beta = prep.v[p:], prep.g[p:], prep.beta[p:]
    out = torch.empty(layout.num_nodes, *v.shape[1:], dtype=torch.float32, device=dev)
    prev = None
    for d, ids in enumerate(layout.levels):
        if d == 0:
            src = prep.anchor_states[layout.node_anchor_slot[ids].to(dev)]
        else:
            src = prev[layout.level_pos[layout.node_parent[ids]].to(dev)]
        ids = ids.to(dev)
        prev, out[ids] = gdn_step(src, qn[ids], kn[ids], v[ids], g[ids], beta[ids])
    return out


def finish_replay(prep: PrefixReplay, node_out: torch.Tensor) -> GDNTreeOutput:
    """Assemble :class:`GDNTreeOutput` from the prefix pass and the node outputs [N, HV, Dv] (any backend)."""
    out = torch.cat([prep.prefix_out, node_out.float()]).to(prep.v.dtype)
    return GDNTreeOutput(out, prep.final_state, prep.final_window)


def gdn_tree_replay(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, params: GDNParams,
                    layout: GDNTreeLayout, initial_state: Optional[torch.Tensor] = None,
                    initial_window: Optional[torch.Tensor] = None, chunk_size: int = DEFAULT_CHUNK) -> GDNTreeOutput:
    """Score a packed row ``[prefix (P) | nodes (N)]`` through a GDN layer's core by indexed state replay.

    mixed_qkv: [P+N, C] projected q/k/v channels before the conv (fp32 / bf16 / fp16); a, b: [P+N, HV] gate
    inputs; params: :class:`GDNParams`; layout: :class:`GDNTreeLayout` (anchors in [-1, P)); initial_state:
    fp32 [HV, Dv, Dk] and initial_window: [C, W-1], the state / conv window before the row (zeros if None);
    chunk_size: C of the prefix pass. Returns :class:`GDNTreeOutput`, equal to
    :func:`~specopd_kernels.gdn.naive.gdn_tree_naive`. Raises ValueError on shapes or chunk_size < 1."""
    prep = replay_prefix(mixed_qkv, a, b, params, layout, initial_state, initial_window, chunk_size)
    return finish_replay(prep, tree_nodes_torch(prep, params, layout))
