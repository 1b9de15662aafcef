"""Proposal-tree scoring inside SGLang's scheduler, on the target model it serves (no second copy).

For each reference, one packed row ``[reference | nodes of every anchor tree]`` (positions and the tree mask
from :mod:`specopd_kernels.tree`) goes through the target's own layers in ONE forward: the prefix is computed
once and shared by every branch. Only attention changes: while a tree forward runs, ``RadixAttention.forward``
is answered by masked attention over the row's own q/k/v (:func:`tree_attention_override`), so the KV cache is
neither read nor written and serving state is untouched. The target's final norm and LM head are the served
ones, so each node's scores equal those of scoring ``prefix + that branch`` as its own sequence.

Tree attention: :func:`specopd_kernels.tree.tree_attention_grouped` (plain torch, exact): causal attention over
the prefix plus, per anchor tree, one joint softmax over the prefix up to the anchor and the tree's own
ancestors, so the cost is O(P^2 + N P + sum n_tree^2) instead of the dense O((P + N)^2) of a [T, T] mask.
With a prefix cache (:mod:`sglang_specopd.server.prefix_cache`, off unless sized) a reference scored before runs only
its tree nodes through the layers, against the recorded prefix K/V.

The FlashInfer packed custom mask (``specopd_kernels.tree.flashinfer_custom_mask``) is the planned GPU fast path
(not yet wired: FlashInfer is not available on the CPU machines).
"""

from __future__ import annotations

import contextvars
from typing import Dict, List, Tuple

import torch

from sglang_specopd.server import compat
from sglang_specopd.server.control import op
from sglang_specopd.server.prefix_cache import PrefixEntry, prefix_key, register_prefix_cache, scheduler_cache
from sglang_specopd.wire.protocol import ScoreTreesError, ScoreTreesRequest, encode_tensors, validate_request

_TREE_LAYOUT: contextvars.ContextVar = contextvars.ContextVar("specopd_tree_layout", default=None)


class _TreeForwardBatch:
    """The few ForwardBatch fields a Llama/Qwen layer stack reads outside attention; everything else is None."""

    def __init__(self, num_tokens: int, device):
        self.forward_mode = compat.get("ForwardMode").EXTEND
        self.residual_stream = None
        self.batch_size = 1
        self.num_tokens = num_tokens
        self.can_run_tbo = False
        self.device = device

    def __getattr__(self, name):
        return None


class _TreeCall:
    """What one tree forward's attention layers need: the row's layout, and optionally a cached reference prefix
    to attend to (``prefix``: the row holds the tree nodes only) or an entry to record the prefix K/V into."""

    def __init__(self, layout, prefix=None, record=None):
        self.layout, self.prefix, self.record = layout, prefix, record


def tree_attention_override(original_fn, self, q, k, v, forward_batch, *args, **kwargs):
    """AROUND hook for ``RadixAttention.forward``: tree attention over the packed row during a tree forward.

    Every attention layer of every served step passes here: outside a tree forward it costs one ContextVar read
    and the wrapper's call (~2 us per layer call on the CI CPU, ~0.06% of a SmolLM2 decode step; see
    ``benchmarks/radix_hook_cost.py``), so nothing else (not even an import) runs before that check."""
    call = _TREE_LAYOUT.get()
    if call is None or not isinstance(forward_batch, _TreeForwardBatch):
        return original_fn(self, q, k, v, forward_batch, *args, **kwargs)
    from specopd_kernels.tree import tree_attention_grouped

    T = q.shape[0]
    q = q.view(T, self.tp_q_head_num, self.qk_head_dim)
    k = k.view(T, self.tp_k_head_num, self.qk_head_dim).to(q.dtype)
    v = v.view(T, self.tp_v_head_num, self.v_head_dim).to(q.dtype)
    prefix_kv = None if call.prefix is None else call.prefix.kv[self.layer_id]
    if call.record is not None:  # keys after RoPE and values, exactly as this layer attends to them
        p = call.layout.prefix_len
        call.record.kv[self.layer_id] = (k[:p].clone(), v[:p].clone())
    out = tree_attention_grouped(q, k, v, call.layout, scale=self.scaling, prefix_kv=prefix_kv)
    return out.reshape(T, self.tp_q_head_num * self.v_head_dim)


def _target_model(scheduler):
    return scheduler.tp_worker.model_runner.model


def tree_forward(model, input_ids, positions, layout, capture_layer_ids=(), *, prefix=None,
                 record=None) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Run the served target on one packed row.

    Args:
        model: SGLang causal LM (``.model`` is the layer stack with ``layers_to_capture``).
        input_ids: int64 [T]; positions: int64 [T]; layout: :class:`specopd_kernels.tree.TreeLayout` of the row.
        capture_layer_ids: DFlash-convention layer ids whose features to return (captured as the input of layer
            id + 1, exactly as SGLang captures them for DFLASH).
        prefix: a :class:`sglang_specopd.server.prefix_cache.PrefixEntry` of this row's prefix: then input_ids /
            positions are the N tree nodes only, which attend to the entry's K/V (no capture).
        record: an empty ``PrefixEntry`` that receives every layer's prefix K/V during this (full) forward.
    Returns:
        (final normed hidden [T, H], list of features [T, H] per capture id, in order).
    """
    inner = model.model
    saved = list(inner.layers_to_capture)
    inner.layers_to_capture = [i + 1 for i in capture_layer_ids]
    fb = _TreeForwardBatch(int(input_ids.shape[0]), input_ids.device)
    token = _TREE_LAYOUT.set(_TreeCall(layout, prefix, record))
    try:
        with torch.inference_mode():
            out = inner(input_ids, positions, fb)
    finally:
        _TREE_LAYOUT.reset(token)
        inner.layers_to_capture = saved
    if isinstance(out, tuple):
        hidden, aux = out
        return hidden, list(aux)
    return out, []


def _lm_head_weight(model) -> torch.Tensor:
    head = getattr(model, "lm_head", None)
    w = getattr(head, "weight", None)
    if w is None:
        w = model.model.embed_tokens.weight
    return w


def _max_position(ref) -> int:
    """The largest position of a reference's packed row: its last token, or its deepest node (a+1+depth)."""
    top = len(ref.input_ids) - 1
    for tree in ref.trees:
        depth: List[int] = []
        for p in tree.flat()[1]:
            depth.append(0 if p == -1 else depth[p] + 1)
        top = max(top, tree.anchor + max(depth, default=-1) + 1)
    return top


@op("score_trees")
def score_trees_op(scheduler, payload: bytes):
    """Scheduler op: JSON :class:`ScoreTreesRequest` bytes in, safetensors bytes out (see routes for the layout)."""
    req = ScoreTreesRequest.model_validate_json(payload)
    model = _target_model(scheduler)
    cfg = scheduler.tp_worker.model_runner.model_config
    validate_request(req, vocab_size=cfg.vocab_size, num_layers=cfg.num_hidden_layers)
    context_len = getattr(cfg, "context_len", None)
    for i, ref in enumerate(req.references):
        top = _max_position(ref)
        if context_len and top >= context_len:
            # /generate refuses such inputs too; a position past the RoPE cache is an IndexError on CPU and a
            # device-side assert on GPU
            raise ScoreTreesError(f"references[{i}]: position {top} is past the model's context length "
                                  f"({context_len} tokens)")
    device = next(model.parameters()).device
    out_dtype = torch.float32 if req.output_dtype == "float32" else torch.bfloat16
    head = _lm_head_weight(model)
    cache = scheduler_cache()
    tensors: Dict[str, torch.Tensor] = {}
    header = {"references": []}
    for i, ref in enumerate(req.references):
        h, feats, node_anchor, num_nodes, cached = _score_reference(model, ref, req, device, cache)
        p = f"ref{i}."
        if "hidden" in req.returns:
            tensors[p + "hidden"] = h.to(out_dtype).cpu()
        if "topk" in req.returns or "logprobs" in req.returns:
            logits = torch.matmul(h.float(), head.float().t())
            lse = torch.logsumexp(logits, dim=-1)
            logprobs = logits - lse[:, None]
            if "topk" in req.returns:
                k = min(req.top_k, logits.shape[-1])
                vals, idx = logprobs.topk(k, dim=-1)
                tensors[p + "topk_ids"] = idx.cpu()
                tensors[p + "topk_logprobs"] = vals.to(out_dtype).cpu()
                tensors[p + "lse"] = lse.cpu()
            if "logprobs" in req.returns:
                tensors[p + "logprobs"] = logprobs.to(out_dtype).cpu()
        if feats:
            tensors[p + "features"] = torch.cat([f[: len(ref.input_ids)] for f in feats], dim=-1).to(out_dtype).cpu()
        tensors[p + "node_anchor"] = node_anchor.cpu()
        header["references"].append({"num_anchors": len(ref.trees), "num_nodes": num_nodes,
                                     "prefix_len": len(ref.input_ids), "prefix_cache": cached})
    return 200, "ok", encode_tensors(tensors, header)


def _score_reference(model, ref, req, device, cache):
    """One reference's rows: ``(hidden [A + N, H] (anchor rows in tree order, then nodes), features, node_anchor
    [N], N, prefix_cache)`` with ``prefix_cache`` "hit" (the prefix's K/V and hidden states came from ``cache``:
    only the N nodes ran through the target), "miss" (full forward, recorded into the cache) or "off" (caching
    disabled, or features requested: those need the full capture)."""
    from specopd_kernels.tree import build_tree_layout, pack_proposal_tree

    anchors, node_tokens, node_parents = [], [], []
    for tree in ref.trees:
        toks, pars = tree.flat()
        anchors.append(tree.anchor)
        node_tokens.append(toks)
        node_parents.append(pars)
    prefix = torch.tensor(ref.input_ids, dtype=torch.long)
    P = len(ref.input_ids)
    # root-only trees (no nodes) need only their anchor rows of the prefix: they join no tree group
    grown = [j for j, toks in enumerate(node_tokens) if toks]
    t_anchors = [anchors[j] for j in grown]
    t_parents = [node_parents[j] for j in grown]
    if grown:
        packed = pack_proposal_tree(prefix, t_anchors, [node_tokens[j] for j in grown], t_parents,
                                    block_size=req.block_size)
        ids, pos = packed.input_ids, packed.positions
        node_anchor = packed.node_anchor
    else:
        ids, pos = prefix, torch.arange(P)
        node_anchor = torch.empty(0, dtype=torch.long)
    layout = build_tree_layout(P, t_anchors, t_parents).to(device)
    anchor_rows = torch.tensor(anchors, dtype=torch.long, device=device)
    use_cache = cache.enabled and not req.feature_layer_ids
    key = prefix_key(ref.input_ids) if use_cache else None
    entry = cache.get(key) if use_cache else None
    if entry is not None:
        nodes = torch.empty(0, entry.hidden.shape[1], dtype=entry.hidden.dtype, device=device)
        if grown:
            nodes, _ = tree_forward(model, ids[P:].to(device), pos[P:].to(device), layout, prefix=entry)
        return torch.cat([entry.hidden.index_select(0, anchor_rows), nodes]), [], node_anchor, ids.shape[0] - P, "hit"
    record = PrefixEntry(P) if use_cache else None
    hidden, feats = tree_forward(model, ids.to(device), pos.to(device), layout, req.feature_layer_ids, record=record)
    if record is not None:
        record.hidden = hidden[:P].clone()
        cache.put(key, record)
    rows = torch.cat([anchor_rows, torch.arange(P, ids.shape[0], device=device)])
    return hidden.index_select(0, rows), feats, node_anchor, ids.shape[0] - P, "miss" if use_cache else "off"


@op("prefix_cache")
def prefix_cache_op(scheduler, payload: bytes):
    """Scheduler op: the prefix cache's stats as JSON; payload ``b"clear"`` empties it first."""
    import json

    cache = scheduler_cache()
    if payload == b"clear":
        cache.clear()
    elif payload:
        raise ValueError(f"unknown prefix_cache action {payload[:32]!r}")
    return 200, "ok", json.dumps(cache.stats()).encode()


def register_scoring() -> None:
    """Register the RadixAttention override (inert unless a tree forward is running) and the prefix cache's
    invalidation on target weight updates."""
    compat.hook("RadixAttention.forward", tree_attention_override)
    register_prefix_cache()
