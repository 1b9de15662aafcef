"""``/specopd/score_trees`` on QSA sparse-attention layers (Qwen4-Exp: Gated DeltaNet layers plus attention layers
whose keys an indexer selects per query; issue 23 part 3).

During a tree forward (:mod:`sglang_specopd.server.scoring.tree_call`) a QSA layer must select, for every node, the keys
sequential decoding of that node's branch ``prefix[:anchor + 1] + ancestors-or-self`` would select, and never touch
the backend's indexer metadata or the QSA pool (its pending key ring and compressed key cache belong to the
requests being served). So:

* ``Qwen4ExpAttentionDecoderLayer._compute_qsa_topk_indices`` (AROUND hook, :func:`qsa_topk_override`) does not
  call SGLang's indexer on a :class:`TreeForwardBatch`: it projects the row's index queries and raw index keys with
  the layer's own ``indexer.project_qk`` (``pool=None``: nothing stored), and selects with
  :func:`specopd_kernels.sparse.qsa_tree_select`: one selection per tree node, shared by every branch through it
  (the branch-consistent indexer groups of docs/sparse_attention.md), with the compressed block keys built from the
  prefix and each block's completing ancestor. It returns a :class:`QSATreeSelection` where SGLang returns its top-k
  token indices.
* The attention hook (:func:`sglang_specopd.server.scoring.forward.tree_attention_override`) sees that selection in
  ``topk_indices`` and runs sparse attention over each row's own selected keys instead of dense tree attention.

Precision, as served: the compressed block keys are rounded to the served compressed-key dtype after the layer's
own RoPE (``indexer.apply_rope``: the same cos / sin cache), and the index queries are cast to it (SGLang stores
bf16 compressed keys and casts the index query even on an fp32 server), so each node selects what SGLang's prefill
of ``prefix + branch`` selects. Hybrid targets score whole rows (no prefix cache, no pieces), as for GDN.
"""

from __future__ import annotations

import weakref

import torch

from sglang_specopd.server import compat
from sglang_specopd.server.scoring.tree_call import TREE_CALL, TreeForwardBatch

SCORE_DTYPE_DEFAULT = torch.bfloat16  # SGLang's default QSA compressed-key cache dtype
_CONFIGS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # indexer -> QSAConfig
# what the QSA layers of the running tree forward selected (scheduler-side, one forward at a time): see take_stats
_STATS: dict = {}


class QSATreeSelection:
    """What a QSA layer's index step returns during a tree forward: the row's
    :class:`specopd_kernels.sparse.QSASelection` (``indices``: int64 [P+N, budget + r - 1] rows of the packed row,
    -1 = none), read by the attention hook of the same layer."""

    def __init__(self, selection):
        self.selection = selection


def qsa_config(indexer, score_dtype=None):
    """The :class:`specopd_kernels.sparse.QSAConfig` of a served ``QSAIndexer`` (built once per indexer): its
    budget and compress ratio, its ``k_layernorm`` (Gemma RMSNorm weight and epsilon), its own RoPE
    (``indexer.apply_rope``) and ``score_dtype`` (default :data:`SCORE_DTYPE_DEFAULT`)."""
    from specopd_kernels.sparse import QSAConfig

    cfg = _CONFIGS.get(indexer)
    if cfg is None:
        def rope(x, positions, _indexer=weakref.proxy(indexer)):
            return _indexer.apply_rope(positions, x[:, None, :])[:, 0, :]

        cfg = QSAConfig(budget=int(indexer.token_topk), compress_ratio=int(indexer.compress_ratio),
                        k_norm_weight=indexer.k_layernorm.weight, norm_eps=float(indexer.k_layernorm.variance_epsilon),
                        rotary_dim=int(indexer.rotary_emb.rotary_dim), rope=rope,
                        score_dtype=score_dtype or SCORE_DTYPE_DEFAULT)
        _CONFIGS[indexer] = cfg
    return cfg


def qsa_tree_selection(layer, call, hidden_states: torch.Tensor, positions: torch.Tensor) -> QSATreeSelection:
    """One QSA layer's selection over the tree forward's packed row.

    Args:
        layer: SGLang's ``Qwen4ExpAttentionDecoderLayer`` (its ``indexer``); call: the :class:`TreeCall`;
        hidden_states: [P+N, H] the layer's attention input; positions: int64 [P+N] each row's position in its
            own branch sequence.
    Returns: :class:`QSATreeSelection`. Raises RuntimeError for a row against a cached prefix or a prefix chunk
    (hybrid targets never run those).
    """
    from specopd_kernels.sparse.select import qsa_tree_select, selections_per_tree

    if call.prefix is not None or call.grow is not None:
        raise RuntimeError("QSA layers score whole rows only (no prefix cache hit or prefix chunk)")
    indexer = layer.indexer
    cfg = qsa_config(indexer)
    index_q, index_k, _ = indexer.project_qk(hidden_states, positions, pool=None)
    p = call.layout.prefix_len
    sel = qsa_tree_select(index_q.to(cfg.score_dtype), index_k[:p], index_k[p:], call.layout, cfg)
    if "selections_per_tree" not in _STATS:  # every QSA layer selects for the same rows: count the first one's
        _STATS["selections_per_tree"] = selections_per_tree(sel, call.layout)
    margins = min_margin_per_tree(sel, call.layout)
    seen = _STATS.get("min_topk_margin_per_tree")
    _STATS["min_topk_margin_per_tree"] = margins if seen is None else [
        b if a is None else a if b is None else min(a, b) for a, b in zip(seen, margins)]
    return QSATreeSelection(sel)


def min_margin_per_tree(sel, layout) -> list:
    """Per anchor tree (packing order, as :func:`specopd_kernels.sparse.select.selections_per_tree`): the smallest
    finite top-k margin of its scored node rows, None when none was scored."""
    n = layout.num_nodes
    if n == 0:
        return []
    margin, anchor = sel.margin[-n:].cpu(), layout.node_anchor.cpu()
    out = []
    for a in dict.fromkeys(anchor.tolist()):
        m = margin[(anchor == a) & torch.isfinite(margin)]
        out.append(float(m.min()) if m.numel() else None)
    return out


def take_stats() -> dict:
    """What the QSA layers of the tree forwards since the last call selected, then forget it: ``{}`` on a target
    without QSA layers, else ``selections_per_tree`` (the indexer selections one layer computed per anchor tree,
    :func:`specopd_kernels.sparse.select.selections_per_tree`) and ``min_topk_margin_per_tree`` (per tree, the
    smallest gap between the last selected and the best unselected block's indexer logit over its scored rows and
    every QSA layer; a gap within float rounding is where another implementation of the same logits, e.g. SGLang's
    prefill, may select another block)."""
    out = dict(_STATS)
    _STATS.clear()
    return out


def qsa_topk_override(original_fn, self, hidden_states, positions, forward_batch, *args, **kwargs):
    """AROUND hook for ``Qwen4ExpAttentionDecoderLayer._compute_qsa_topk_indices``: during a tree forward,
    :func:`qsa_tree_selection` (SGLang's indexer, its metadata and its pool are not touched); otherwise SGLang's."""
    call = TREE_CALL.get()
    if call is None or not isinstance(forward_batch, TreeForwardBatch):
        return original_fn(self, hidden_states, positions, forward_batch, *args, **kwargs)
    return qsa_tree_selection(self, call, hidden_states, positions)


def qsa_tree_attention(q, k, v, selection: QSATreeSelection, scale: float) -> torch.Tensor:
    """The attention of a QSA layer over the packed row: each row's softmax over its own selected keys (GQA).
    q [T, Hq, D], k / v [T, Hkv, D] (after RoPE, q's dtype). Returns [T, Hq, Dv]."""
    from specopd_kernels.sparse import get_sparse_attention

    return get_sparse_attention(q.device)(q, k, v, selection.selection.indices, scale)


def register_qsa_scoring() -> None:
    """Register the QSA tree hook (inert unless a tree forward runs through a Qwen4-Exp attention layer)."""
    compat.hook("Qwen4ExpAttentionDecoderLayer._compute_qsa_topk_indices", qsa_topk_override)
