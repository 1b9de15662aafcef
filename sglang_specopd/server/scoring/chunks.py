"""One reference of ``/specopd/score_trees`` in pieces of at most a token budget (the scheduler interleaves them
with its batches, see :mod:`sglang_specopd.server.scoring.queue`).

A reference whose packed row ``[prefix (P) | tree nodes (N)]`` exceeds the budget B runs as
  1. prefix chunks of at most B rows: chunk ``[s, e)`` is a chain tree at anchor ``s - 1`` over the K/V of rows
     ``< s`` (exactly causal attention), whose K/V go into a :class:`PrefixEntry` (the prefix cache's record,
     filled chunk by chunk; a cached prefix skips this step) and whose features are captured as in one forward;
  2. the anchor rows' outputs from the recorded prefix hidden states (no forward);
  3. slices of whole anchor trees with at most B nodes together (a single tree above B runs alone), as the
     prefix cache's hit path: nodes only, attending to the recorded prefix K/V.
Each step's LM-head outputs are computed for its own rows, so no step holds more than B rows of logits. Values
equal the one-forward ones up to float rounding at a different row count, like the prefix cache's hits.

Also :func:`score_trees_steps`, the generator over a whole request's pieces that the scheduler's score queue
drives (:mod:`sglang_specopd.server.scoring.queue`: all at once when the budget is off).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch

from sglang_specopd.server.prefix_cache import PrefixEntry, prefix_key, scheduler_cache
from sglang_specopd.server.scoring.gdn import has_gdn_layers
from sglang_specopd.server.scoring.qsa import take_stats
from sglang_specopd.server.scoring.forward import (
    ReferencePlan,
    head_outputs,
    served_head,
    score_reference,
    target_model,
    tree_forward,
)
from sglang_specopd.wire.protocol import ScoreTreesRequest, encode_tensors


def _chunk_layout(start: int, end: int):
    """Layout of prefix chunk ``[start, end)``: the prefix itself for the first chunk, else one chain tree of
    ``end - start`` nodes at anchor ``start - 1`` (node d sits at position start + d and sees rows <= start - 1,
    then its chain ancestors and itself: causal attention)."""
    from specopd_kernels.tree import build_tree_layout

    if start == 0:
        return build_tree_layout(end, [], [])
    return build_tree_layout(start, [start - 1], [[-1] + list(range(end - start - 1))])


def tree_slices(sizes: List[int], budget: int) -> List[Tuple[int, int]]:
    """Consecutive ``[j0, j1)`` ranges of trees with node counts ``sizes``: each range holds at most ``budget``
    nodes, or one tree alone when that tree is larger. Raises ValueError if budget < 1."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1 token, got {budget}")
    out, j0, total = [], 0, 0
    for j, n in enumerate(sizes):
        if j > j0 and total + n > budget:
            out.append((j0, j))
            j0, total = j, 0
        total += n
    if j0 < len(sizes):
        out.append((j0, len(sizes)))
    return out


def _prefix_chunks(model, plan: ReferencePlan, req, device, budget: int):
    """Generator: run the prefix in chunks of ``budget`` rows (yields each chunk's row count); returns
    ``(entry, features)``: the filled :class:`PrefixEntry` (K/V of every layer, ``hidden`` [P, H]) and the
    context features [P, K*H] (None when none were asked)."""
    P = plan.P
    entry = PrefixEntry(P)
    hidden, feats = [], []
    for start in range(0, P, budget):
        end = min(P, start + budget)
        layout = _chunk_layout(start, end).to(device)
        h, f = tree_forward(model, plan.ids[start:end].to(device), plan.pos[start:end].to(device), layout,
                            req.feature_layer_ids, grow=(entry, start))
        hidden.append(h)
        feats.append(f)
        yield end - start
    entry.hidden = torch.cat(hidden)
    features = None
    if req.feature_layer_ids:
        features = torch.cat([torch.cat([f[i] for f in feats]) for i in range(len(req.feature_layer_ids))], dim=-1)
    return entry, features


def score_reference_chunked(model, ref, req, device, cache, budget: int,
                            head_outputs: Callable[[torch.Tensor], Dict[str, torch.Tensor]]):
    """Generator over one reference's pieces (yields the rows each ran, at most ``budget`` unless one tree alone
    is larger); returns ``(outputs, features, node_anchor, N, prefix_cache)`` like the one-forward path:
    ``outputs`` the :func:`sglang_specopd.server.scoring.forward.head_outputs` dict of all A + N rows (anchors first),
    ``features`` [P, K*H] or None, ``prefix_cache`` "hit" / "miss" / "off"."""
    from specopd_kernels.tree import build_tree_layout

    plan = ReferencePlan(ref, req)
    P = plan.P
    use_cache = cache.enabled and not req.feature_layer_ids
    key = prefix_key(ref.input_ids) if use_cache else None
    entry = cache.get(key) if use_cache else None
    state = "hit" if entry is not None else ("miss" if use_cache else "off")
    features = None
    blocks: List[Dict[str, torch.Tensor]] = []
    if entry is None:
        entry, features = yield from _prefix_chunks(model, plan, req, device, budget)
        if use_cache:
            cache.put(key, entry)
    anchor_rows = torch.tensor(plan.anchors, dtype=torch.long, device=device)
    blocks.append(head_outputs(entry.hidden.index_select(0, anchor_rows)))
    offsets = [0]
    for n in plan.t_sizes:
        offsets.append(offsets[-1] + n)
    for j0, j1 in tree_slices(plan.t_sizes, budget):
        layout = build_tree_layout(P, plan.t_anchors[j0:j1], plan.t_parents[j0:j1]).to(device)
        r0, r1 = P + offsets[j0], P + offsets[j1]
        h, _ = tree_forward(model, plan.ids[r0:r1].to(device), plan.pos[r0:r1].to(device), layout, prefix=entry)
        blocks.append(head_outputs(h))
        yield r1 - r0
    outputs = {k: torch.cat([b[k] for b in blocks]) for k in blocks[0]}
    return outputs, features, plan.node_anchor, plan.N, state


def reference_work(ref) -> int:
    """Rows of a reference's one-piece forward: P prefix tokens + N tree nodes (the unit of the piece budget)."""
    return len(ref.input_ids) + sum(len(t.flat()[0]) for t in ref.trees)


def score_trees_steps(scheduler, req: ScoreTreesRequest, budget_tokens: int = 0):
    """Score ``req`` in pieces: a generator that yields the rows of target forward each piece ran and returns
    ``(200, "ok", safetensors bytes)`` (the reply layout of :mod:`sglang_specopd.server.routes`).

    ``budget_tokens`` 0 (or a reference of at most that many rows): the reference runs as ONE forward, exactly
    as an unchunked call; larger references run as pieces of at most ``budget_tokens`` rows
    (:func:`score_reference_chunked`: prefix chunks, then slices of its anchor
    trees), whose outputs equal the one-forward ones up to float rounding at another row count (as the prefix
    cache's). On a hybrid Gated DeltaNet target every reference is one piece (:mod:`sglang_specopd.server.scoring.gdn`).
    The caller decides how many pieces run per scheduler iteration."""
    model = target_model(scheduler)
    device = next(model.parameters()).device
    out_dtype = torch.float32 if req.output_dtype == "float32" else torch.bfloat16
    head = served_head(model, int(scheduler.tp_worker.model_runner.model_config.vocab_size))
    cache = scheduler_cache()
    whole = budget_tokens <= 0 or has_gdn_layers(model)  # a hybrid GDN target's prefix state is not chunked
    tensors: Dict[str, torch.Tensor] = {}
    header = {"references": []}
    for i, ref in enumerate(req.references):
        work = reference_work(ref)
        take_stats()  # drop what a forward that failed before its reply left behind
        if whole or work <= budget_tokens:
            h, feats, node_anchor, num_nodes, cached = score_reference(model, ref, req, device, cache)
            outs = head_outputs(h, head, req, out_dtype)
            features = torch.cat([f[: len(ref.input_ids)] for f in feats], dim=-1) if feats else None
            yield work
        else:
            outs, features, node_anchor, num_nodes, cached = yield from score_reference_chunked(
                model, ref, req, device, cache, budget_tokens, lambda h: head_outputs(h, head, req, out_dtype))
        p = f"ref{i}."
        tensors.update({p + k: t for k, t in outs.items()})
        if features is not None:
            tensors[p + "features"] = features.to(out_dtype).cpu()
        tensors[p + "node_anchor"] = node_anchor.cpu()
        header["references"].append({"num_anchors": len(ref.trees), "num_nodes": num_nodes,
                                     "prefix_len": len(ref.input_ids), "prefix_cache": cached,
                                     **{f"qsa_{k}": v for k, v in take_stats().items()}})
    return 200, "ok", encode_tensors(tensors, header)


def run_to_end(steps):
    """Drive a :func:`score_trees_steps` generator to its end in one go; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value
