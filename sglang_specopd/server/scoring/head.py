"""The score_trees LM head under tensor parallelism: top-k, full log-probs and log-sum-exp from vocab shards.

Under ``--tp-size N`` SGLang's LM head (``ParallelLMHead`` / a tied ``VocabParallelEmbedding``) holds rows
``[r * Vl, (r + 1) * Vl)`` of the padded vocabulary on rank r (``Vl`` rows each; the real ids end at the
unpadded vocabulary size, so only the last ranks hold padding rows). Each rank computes its own logits block
``h @ W_r^T`` [R, Vl]; :func:`shard_head_outputs` turns the blocks into the unsharded answers with one
``gather`` (an all-gather along the last dim, rank order) of per-row statistics:

* log-sum-exp: each rank's ``(m_r, s_r)`` = (row max, sum of exp(l - m_r)) over its real ids; then
  ``m = max_r m_r``, ``lse = m + log(sum_r s_r exp(m_r - m))``;
* top-k: each rank's local top-k (global ids = local index + its ``start``), gathered, then the top-k of those;
* full log-probs: the gathered logits cut to the real vocabulary, minus the lse.

With one rank ``gather`` is the identity and the same code is the single-process path. ``tests/test_score_head.py``
shards a head over 2 gloo ranks (spawned processes) and matches the unsharded values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Optional

import torch

from sglang_specopd.server import compat

Gather = Callable[[torch.Tensor], torch.Tensor]  # [R, n] local -> [R, world * n], ranks in order, on every rank
HEAD_ROW_BLOCK = 64  # rows of logits per local reduction (a block stays in cache while it is reduced)


@dataclass(frozen=True)
class VocabShard:
    """This rank's slice of a vocab-parallel LM head: ``start`` (global id of local row 0), ``valid`` (local rows
    that are real ids; the rest are padding), ``vocab_size`` (the real, unpadded vocabulary) and ``world`` (ranks
    the head is split over; 1 = not split). Raises ValueError for inconsistent values."""

    start: int
    valid: int
    vocab_size: int
    world: int = 1

    def __post_init__(self) -> None:
        if self.world < 1 or self.start < 0 or self.valid < 0 or self.start + self.valid > self.vocab_size:
            raise ValueError(f"invalid vocab shard {self}")


def identity_gather(t: torch.Tensor) -> torch.Tensor:
    return t


def shard_head_outputs(h: torch.Tensor, weight: torch.Tensor, returns: Iterable[str], top_k: int, out_dtype,
                       shard: Optional[VocabShard] = None, gather: Gather = identity_gather) -> Dict[str, torch.Tensor]:
    """Per-row LM-head outputs of hidden rows ``h`` [R, H] from this rank's head rows ``weight`` [Vl, H].

    Args:
        returns: which of ``"topk"`` (``topk_ids`` int64 [R, k], ``topk_logprobs`` [R, k] in ``out_dtype``,
            ``lse`` fp32 [R]) and ``"logprobs"`` (``logprobs`` [R, V] in ``out_dtype``) to compute; k =
            min(``top_k``, V). Logits are fp32 (``h`` and ``weight`` are upcast).
        shard: this rank's :class:`VocabShard`; None = the whole head on one rank (every row real).
        gather: all-gather along the last dim over the ranks of the head's group (the identity for one rank);
            every rank must call this function with the same rows and ``returns`` (it is collective).
    Returns: CPU tensors by key; empty dict when neither is asked for.
    """
    returns = set(returns)
    if not returns & {"topk", "logprobs"}:
        return {}
    shard = shard or VocabShard(0, int(weight.shape[0]), int(weight.shape[0]))
    w = weight[: shard.valid].float()
    rows = h.float()
    k = min(int(top_k), shard.vocab_size)
    k_local = min(k, shard.valid)
    stats, tops, blocks = [], [], []
    for b in rows.split(HEAD_ROW_BLOCK) if rows.shape[0] else [rows]:
        logits = torch.matmul(b, w.t())  # [r, valid]
        if shard.valid:
            m = logits.max(dim=-1).values
            s = torch.exp(logits - m[:, None]).sum(dim=-1)
        else:  # a rank holding only padding
            m = torch.full((b.shape[0],), float("-inf"))
            s = torch.zeros(b.shape[0])
        stats.append(torch.stack([m, s], dim=-1))
        if "topk" in returns:
            tops.append(logits.topk(k_local, dim=-1))
        if "logprobs" in returns:
            blocks.append(logits)
    st = gather(torch.cat(stats)).view(rows.shape[0], shard.world, 2)  # [R, world, (m_r, s_r)]
    m_all = st[..., 0].max(dim=-1).values
    scale = torch.where(torch.isinf(st[..., 0]), torch.zeros_like(st[..., 1]), torch.exp(st[..., 0] - m_all[:, None]))
    lse = m_all + torch.log((st[..., 1] * scale).sum(dim=-1))
    out: Dict[str, torch.Tensor] = {}
    if "topk" in returns:
        vals = torch.cat([t.values for t in tops]) if tops else torch.empty(0, k_local)
        ids = torch.cat([t.indices for t in tops]) + shard.start if tops else torch.empty(0, k_local, dtype=torch.long)
        if k_local < k:  # pad so that every rank gathers the same width (padding never wins: -inf)
            vals = torch.cat([vals, vals.new_full((vals.shape[0], k - k_local), float("-inf"))], dim=-1)
            ids = torch.cat([ids, ids.new_full((ids.shape[0], k - k_local), -1)], dim=-1)
        all_vals, all_ids = gather(vals), gather(ids)
        best = all_vals.topk(k, dim=-1)
        out["topk_ids"] = all_ids.gather(-1, best.indices).cpu()
        out["topk_logprobs"] = (best.values - lse[:, None]).to(out_dtype).cpu()
        out["lse"] = lse.cpu()
    if "logprobs" in returns:
        local = torch.cat(blocks) if blocks else torch.empty(rows.shape[0], shard.valid)
        width = int(weight.shape[0])  # pad to the shard's row count: the ranks' blocks tile the padded vocabulary
        if local.shape[1] < width:
            local = torch.cat([local, local.new_full((local.shape[0], width - local.shape[1]), float("-inf"))], -1)
        full = gather(local)[:, : shard.vocab_size]
        out["logprobs"] = (full - lse[:, None]).to(out_dtype).cpu()
    return out


def head_shard_of(module, weight: torch.Tensor, vocab_size: int, world: int) -> VocabShard:
    """The :class:`VocabShard` of an SGLang vocab-parallel head ``module`` (its ``shard_indices``: the real ids
    ``org_vocab_start_index .. org_vocab_end_index`` on this rank), or the whole head when ``world`` is 1 or the
    module has no shard indices."""
    idx = getattr(module, "shard_indices", None)
    if world <= 1 or idx is None:
        n = min(int(weight.shape[0]), int(vocab_size))
        return VocabShard(0, n, n)
    start, end = int(idx.org_vocab_start_index), int(idx.org_vocab_end_index)
    return VocabShard(start, end - start, int(vocab_size), world)


@dataclass(frozen=True)
class ServedHead:
    """The served LM head as score_trees uses it: this rank's ``weight`` rows, their
    :class:`~sglang_specopd.server.scoring.head.VocabShard`, and the ``gather`` over the head's tensor-parallel group
    (the identity on one rank)."""

    weight: torch.Tensor
    shard: VocabShard
    gather: Gather


def served_head(model, vocab_size: int) -> ServedHead:
    """The :class:`ServedHead` of an SGLang causal LM: its ``lm_head`` (else the tied ``embed_tokens``); split over
    ``tp_size`` ranks, it gathers over SGLang's TP group (the attention-TP group when the head uses that one)."""
    module = getattr(model, "lm_head", None)
    if getattr(module, "weight", None) is None:
        module = model.model.embed_tokens
    world = int(getattr(module, "tp_size", 1) or 1)
    gather = identity_gather
    if world > 1:
        if getattr(module, "use_attn_tp_group", False):
            group = compat.get("get_attn_tp_group")()
        else:
            group = compat.get("get_tp_group")()
        gather = lambda t: group.all_gather(t.contiguous(), dim=-1)  # noqa: E731
    return ServedHead(module.weight, head_shard_of(module, module.weight, vocab_size, world), gather)
