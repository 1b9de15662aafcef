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

With a piece budget (``score_trees_budget_tokens``) a reference larger than the budget runs in pieces instead
(:mod:`sglang_specopd.server.scoring.chunks`, queued by :mod:`sglang_specopd.server.scoring.queue`).

Hybrid Gated DeltaNet targets (:mod:`sglang_specopd.server.scoring.gdn`): the full-attention layers use the tree
attention above, the GDN layers indexed state replay over the same row; no prefix cache, no pieces; a target
with another kind of recurrent layer is refused (HTTP 400).

The attention kernel is chosen per device by :func:`specopd_kernels.tree.get_tree_attention` (plain torch on CPU;
on CUDA a kernel only when the GPU acceptance run verified it, see :mod:`specopd_kernels.verified`); the
FlashInfer custom-mask path (:mod:`specopd_kernels.tree.flashinfer_attention`) is one of those kernels. Under
tensor parallelism the LM head is vocab-sharded: top-k, full log-probs and the log-sum-exp are gathered over the TP
group (:mod:`sglang_specopd.server.scoring.head`).
"""

from __future__ import annotations

import logging
from typing import Dict, List, Tuple

import torch

from sglang_specopd.server import compat
from sglang_specopd.server.control import op
from sglang_specopd.server.prefix_cache import PrefixEntry, prefix_key, register_prefix_cache, scheduler_cache
from sglang_specopd.server.scoring.gdn import (
    capture_layers,
    check_scorable,
    gdn_dims,
    has_gdn_layers,
    register_gdn_scoring,
)
from sglang_specopd.server.qwen4_exp_features import register_qwen4_exp_features
from sglang_specopd.server.scoring.head import HEAD_ROW_BLOCK, ServedHead, VocabShard, identity_gather, served_head
from sglang_specopd.server.scoring.head import shard_head_outputs
from sglang_specopd.server.scoring.qsa import QSATreeSelection, qsa_tree_attention, register_qsa_scoring
from sglang_specopd.server.scoring.tree_call import TREE_CALL, TreeCall, TreeForwardBatch
from sglang_specopd.wire.protocol import ScoreTreesError, ScoreTreesRequest, validate_request

logger = logging.getLogger("sglang_specopd.server.scoring.forward")


def _grow_prefix(grow, layer_id: int, k: torch.Tensor, v: torch.Tensor):
    """Write a prefix chunk's k, v ``[T, Hkv, D]`` at rows ``start..start+T`` of the entry's per-layer buffers
    (allocated ``[entry.length, Hkv, D]`` on the first chunk); return the K/V of the rows before ``start`` (the
    chunk's ``prefix_kv``), or None for the first chunk (which attends causally to itself only)."""
    entry, start = grow
    bufs = entry.kv.get(layer_id)
    if bufs is None:
        bufs = (k.new_empty((entry.length,) + tuple(k.shape[1:])), v.new_empty((entry.length,) + tuple(v.shape[1:])))
        entry.kv[layer_id] = bufs
    bufs[0][start: start + k.shape[0]].copy_(k)
    bufs[1][start: start + v.shape[0]].copy_(v)
    return None if start == 0 else (bufs[0][:start], bufs[1][:start])


def tree_attention_override(original_fn, self, q, k, v, forward_batch, *args, **kwargs):
    """AROUND hook for ``RadixAttention.forward``: tree attention over the packed row during a tree forward.

    Every attention layer of every served step passes here: outside a tree forward it costs one ContextVar read
    and the wrapper's call (~2 us per layer call on the CI CPU, ~0.06% of a SmolLM2 decode step; see
    ``benchmarks/radix_hook_cost.py``), so nothing else (not even an import) runs before that check."""
    call = TREE_CALL.get()
    if call is None or not isinstance(forward_batch, TreeForwardBatch):
        return original_fn(self, q, k, v, forward_batch, *args, **kwargs)
    from specopd_kernels.tree import get_tree_attention

    T = q.shape[0]
    q = q.view(T, self.tp_q_head_num, self.qk_head_dim)
    k = k.view(T, self.tp_k_head_num, self.qk_head_dim).to(q.dtype)
    v = v.view(T, self.tp_v_head_num, self.v_head_dim).to(q.dtype)
    selection = kwargs.get("topk_indices")
    if isinstance(selection, QSATreeSelection):  # a QSA layer: each row attends to its own selected keys
        out = qsa_tree_attention(q, k, v, selection, self.scaling)
        return out.reshape(T, self.tp_q_head_num * self.v_head_dim)
    prefix_kv = None if call.prefix is None else call.prefix.kv[self.layer_id]
    if call.grow is not None:
        prefix_kv = _grow_prefix(call.grow, self.layer_id, k, v)
    if call.record is not None:  # keys after RoPE and values, exactly as this layer attends to them
        p = call.layout.prefix_len
        call.record.kv[self.layer_id] = (k[:p].clone(), v[:p].clone())
    out = get_tree_attention(q.device)(q, k, v, call.layout, scale=self.scaling, prefix_kv=prefix_kv)
    return out.reshape(T, self.tp_q_head_num * self.v_head_dim)


def target_model(scheduler):
    """The served target model (SGLang's causal LM module) of a scheduler."""
    return scheduler.tp_worker.model_runner.model


def tree_forward(model, input_ids, positions, layout, capture_layer_ids=(), *, prefix=None,
                 record=None, grow=None) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Run the served target on one packed row.

    Args:
        model: SGLang causal LM (``.model`` is the layer stack with ``layers_to_capture``).
        input_ids: int64 [T]; positions: int64 [T]; layout: :class:`specopd_kernels.tree.TreeLayout` of the row.
        capture_layer_ids: DFlash-convention layer ids whose features to return (captured as the input of layer
            id + 1, exactly as SGLang captures them for DFLASH).
        prefix: a :class:`sglang_specopd.server.prefix_cache.PrefixEntry` of this row's prefix: then input_ids /
            positions are the N tree nodes only, which attend to the entry's K/V (no capture).
        record: an empty ``PrefixEntry`` that receives every layer's prefix K/V during this (full) forward.
        grow: ``(entry, start)``: the row is the prefix chunk ``start..start+T`` of ``entry`` (``layout``: prefix
            only when ``start`` is 0, else one chain tree at anchor ``start - 1``); its K/V are written into the
            entry and it attends to the entry's K/V of rows ``< start`` (features are captured as usual).
    Returns:
        (final normed hidden [T, H], list of features [T, H] per capture id, in order).
    """
    inner = model.model
    fb = TreeForwardBatch(int(input_ids.shape[0]), input_ids.device)
    token = TREE_CALL.set(TreeCall(layout, prefix, record, grow))
    try:
        with torch.inference_mode(), capture_layers(inner, [i + 1 for i in capture_layer_ids]):
            out = inner(input_ids, positions, fb)
    finally:
        TREE_CALL.reset(token)
    if isinstance(out, tuple):
        hidden, aux = out
        return hidden, list(aux)
    return out, []


def lm_head_weight(model) -> torch.Tensor:
    """The target's LM head weight [V, H] (the tied embedding when there is no separate head); under tensor
    parallelism this rank's vocab shard only (use :func:`served_head` to score with it)."""
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


def parse_score_request(scheduler, payload: bytes) -> ScoreTreesRequest:
    """Parse and check one request against the served target (before any forward).

    Raises ScoreTreesError / pydantic ValidationError (both ValueError: HTTP 400) with the reason: a target whose
    layers score_trees cannot score (:func:`sglang_specopd.server.scoring.gdn.check_scorable`), bad token ids,
    anchors, tree shapes or feature layer ids (:func:`validate_request`), or a position past the context length.
    """
    check_scorable(scheduler.tp_worker.model_runner)
    req = ScoreTreesRequest.model_validate_json(payload)
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
    return req


def head_outputs(h: torch.Tensor, head, req: ScoreTreesRequest, out_dtype) -> Dict[str, torch.Tensor]:
    """The returned per-row tensors of hidden rows ``h`` [R, H]: ``hidden``, ``topk_ids`` / ``topk_logprobs`` /
    ``lse``, ``logprobs`` (as ``req.returns`` asks; keys without the ``ref{i}.`` prefix, CPU tensors). ``head``: a
    :class:`ServedHead` (vocab-parallel heads gathered: :func:`~sglang_specopd.server.scoring.head.
    shard_head_outputs`) or a plain weight [V, H]. Rows are independent, so blocks of rows concatenated give the
    outputs of all rows."""
    if isinstance(head, torch.Tensor):
        head = ServedHead(head, VocabShard(0, int(head.shape[0]), int(head.shape[0])), identity_gather)
    out: Dict[str, torch.Tensor] = {}
    if "hidden" in req.returns:
        out["hidden"] = h.to(out_dtype).cpu()
    out.update(shard_head_outputs(h, head.weight, req.returns, req.top_k, out_dtype, head.shard, head.gather))
    return out


class ReferencePlan:
    """One reference's packed row: ``ids`` / ``pos`` int64 [P + N] (prefix, then the nodes of every grown tree in
    tree order), ``anchors`` (all A trees), ``grown`` (indices of the trees with nodes), their anchors / parents /
    node counts, ``node_anchor`` int64 [N] (index among the grown trees), P and N."""

    def __init__(self, ref, req):
        from specopd_kernels.tree import pack_proposal_tree

        self.anchors, node_tokens, node_parents = [], [], []
        for tree in ref.trees:
            toks, pars = tree.flat()
            self.anchors.append(tree.anchor)
            node_tokens.append(toks)
            node_parents.append(pars)
        prefix = torch.tensor(ref.input_ids, dtype=torch.long)
        self.P = P = len(ref.input_ids)
        # root-only trees (no nodes) need only their anchor rows of the prefix: they join no tree group
        self.grown = [j for j, toks in enumerate(node_tokens) if toks]
        self.t_anchors = [self.anchors[j] for j in self.grown]
        self.t_parents = [node_parents[j] for j in self.grown]
        self.t_sizes = [len(node_tokens[j]) for j in self.grown]
        if self.grown:
            packed = pack_proposal_tree(prefix, self.t_anchors, [node_tokens[j] for j in self.grown],
                                        self.t_parents, block_size=req.block_size)
            self.ids, self.pos, self.node_anchor = packed.input_ids, packed.positions, packed.node_anchor
        else:
            self.ids, self.pos = prefix, torch.arange(P)
            self.node_anchor = torch.empty(0, dtype=torch.long)
        self.N = self.ids.shape[0] - P


def score_reference(model, ref, req, device, cache):
    """One reference's rows: ``(hidden [A + N, H] (anchor rows in tree order, then nodes), features, node_anchor
    [N], N, prefix_cache)`` with ``prefix_cache`` "hit" (the prefix's K/V and hidden states came from ``cache``:
    only the N nodes ran through the target), "miss" (full forward, recorded into the cache) or "off" (caching
    disabled, features requested: those need the full capture, or a hybrid GDN target: its GDN layers' prefix
    state is not cached, every call runs the whole row)."""
    from specopd_kernels.tree import build_tree_layout

    plan = ReferencePlan(ref, req)
    P, ids, pos, node_anchor = plan.P, plan.ids, plan.pos, plan.node_anchor
    layout = build_tree_layout(P, plan.t_anchors, plan.t_parents).to(device)
    anchor_rows = torch.tensor(plan.anchors, dtype=torch.long, device=device)
    use_cache = cache.enabled and not req.feature_layer_ids and not has_gdn_layers(model)
    key = prefix_key(ref.input_ids) if use_cache else None
    entry = cache.get(key) if use_cache else None
    if entry is not None:
        nodes = torch.empty(0, entry.hidden.shape[1], dtype=entry.hidden.dtype, device=device)
        if plan.grown:
            nodes, _ = tree_forward(model, ids[P:].to(device), pos[P:].to(device), layout, prefix=entry)
        return torch.cat([entry.hidden.index_select(0, anchor_rows), nodes]), [], node_anchor, plan.N, "hit"
    record = PrefixEntry(P) if use_cache else None
    hidden, feats = tree_forward(model, ids.to(device), pos.to(device), layout, req.feature_layer_ids, record=record)
    if record is not None:
        record.hidden = hidden[:P].clone()
        cache.put(key, record)
    rows = torch.cat([anchor_rows, torch.arange(P, ids.shape[0], device=device)])
    return hidden.index_select(0, rows), feats, node_anchor, plan.N, "miss" if use_cache else "off"


@op("score_dims")
def score_dims_op(scheduler, payload: bytes):
    """Scheduler op: the served target's sizes as JSON (the fields of
    :class:`sglang_specopd.server.scoring.cost.TargetDims`), for the HTTP side's cost check."""
    import json

    cfg = scheduler.tp_worker.model_runner.model_config
    hf = getattr(cfg, "hf_text_config", None) or cfg.hf_config
    model = target_model(scheduler)
    heads = int(getattr(hf, "num_attention_heads", None) or 1)  # absent on pure Mamba targets (refused anyway)
    dims = {"num_layers": int(hf.num_hidden_layers), "hidden": int(hf.hidden_size),
            "intermediate": int(getattr(hf, "intermediate_size", None) or 4 * hf.hidden_size), "q_heads": heads,
            "kv_heads": int(getattr(hf, "num_key_value_heads", None) or heads),
            "head_dim": int(getattr(hf, "head_dim", None) or hf.hidden_size // heads), "vocab": int(cfg.vocab_size),
            "act_bytes": next(model.parameters()).element_size(),
            "context_len": int(getattr(cfg, "context_len", 0) or 0)}
    dims.update(gdn_dims(scheduler.tp_worker.model_runner))
    return 200, "ok", json.dumps(dims).encode()


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


def log_kernel_choices(result, self, *args, **kwargs):
    """AFTER hook for ``Scheduler.init_request_dispatcher`` (once per scheduler, at start): log which backend each
    kernel op runs on the served device (:func:`specopd_kernels.choices.kernel_choices`: on CUDA a Triton /
    FlashInfer kernel only when the GPU acceptance run verified it, else torch; ``SPECOPD_KERNELS`` and the
    per-op variables override). A failure to read the device is logged, never raised."""
    try:
        from specopd_kernels.choices import kernel_choices

        device = next(target_model(self).parameters()).device
        logger.info("specopd kernels (score_trees; e2e_tv is the trainer's): %s", kernel_choices(device))
    except Exception as exc:  # noqa: BLE001 - a log line must not stop the server
        logger.warning("specopd kernels: could not report the kernel choice: %s", exc)
    return result


def register_scoring() -> None:
    """Register the RadixAttention, GDN and QSA overrides (inert unless a tree forward is running), the prefix
    cache's invalidation on target weight updates and the kernel-choice log line at scheduler start."""
    compat.hook("RadixAttention.forward", tree_attention_override)
    compat.hook("Scheduler.init_request_dispatcher", log_kernel_choices)
    register_gdn_scoring()
    register_qsa_scoring()
    register_qwen4_exp_features()
    register_prefix_cache()
