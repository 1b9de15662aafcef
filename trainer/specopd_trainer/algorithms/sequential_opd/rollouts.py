"""Sequential-rollout OPD's rollouts and their loss (same E2E-TV loss as SpecOPD, supervision from real rollouts).

One step: the current drafter is pushed into the live server (hot swap), real draft-and-verify rollouts run
through the SPECOPD worker at ``temperature`` (``/generate`` with the per-request acceptance trace); each verify
step of the trace is one on-policy state: its anchor and the drafter's proposed block. The blocks are scored by
the target (one ``score_trees`` call: the rollout text as the reference, one branch per recorded block), the
drafter recomputes q at those anchors from the rollout's context features, and the loss is E2E-TV exactly as in
SpecOPD. Supervision arrives one verify step at a time, sequentially, which is what makes it slow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch


@dataclass(frozen=True)
class Rollout:
    """One rollout: full token ids (prompt + generated), prompt length and the verify records."""

    token_ids: List[int]
    prompt_len: int
    records: List[dict]


def collect_rollouts(client, prompts: List[List[int]], *, max_new_tokens: int, temperature: float,
                     concurrency: int = 8) -> List[Rollout]:
    """Generate with the served drafter, asking for traces; one :class:`Rollout` per prompt."""
    from concurrent.futures import ThreadPoolExecutor

    def one(p):
        out = client.generate(p, max_new_tokens=max_new_tokens, temperature=temperature, trace=True)
        return Rollout(token_ids=list(p) + list(out["output_ids"]), prompt_len=len(p),
                       records=out["meta_info"].get("specopd_trace") or [])

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, prompts))


@dataclass(frozen=True)
class RecordedBlocks:
    """The recorded blocks of one rollout packed as one-branch proposal trees (shared by sequential OPD and
    Draft-OPD). token_ids: the rollout (prompt + output). records: the verify records kept (``anchor``,
    ``proposed``, ...). packed: :class:`specopd_trainer.loops.branch_tree.PackedBranches` of the records' first
    G-1 proposed tokens (one branch per anchor; slot 1 is the anchor row, slot k the row of proposed token k-1)."""

    token_ids: List[int]
    records: List[dict]
    packed: object


def pack_recorded_blocks(token_ids: List[int], records: List[dict], g: int) -> RecordedBlocks:
    """Pack ``records`` (each with ``anchor`` and at least G-1 = ``g - 1`` ``proposed`` ids) of the rollout
    ``token_ids`` as one-branch proposal trees. Raises ValueError for an empty ``records``."""
    from specopd_trainer.loops.branch_tree import pack_branches

    if not records:
        raise ValueError("no records to pack")
    packed = pack_branches(torch.tensor([[x["proposed"][: g - 1]] for x in records], dtype=torch.long), g - 1)
    return RecordedBlocks(list(token_ids), list(records), packed)


def score_recorded_blocks(client, blocks: List[RecordedBlocks], block_size: int, layer_ids: List[int]) -> list:
    """ONE ``score_trees`` call for every block of ``blocks``: per rollout the target's final hidden states (one row
    per anchor, then one per tree node) and the rollout's context features at ``layer_ids`` (fp32). Returns the
    client's :class:`ScoredReference` list, aligned with ``blocks``."""
    from sglang_specopd.wire.protocol import ScoreTreesRequest

    refs = [{"input_ids": b.token_ids,
             "trees": [{"anchor": x["anchor"], "tokens": t, "parents": par}
                       for x, t, par in zip(b.records, b.packed.tokens, b.packed.parents)]} for b in blocks]
    return client.score_trees(ScoreTreesRequest(references=refs, block_size=block_size, returns=["hidden"],
                                                feature_layer_ids=list(layer_ids), output_dtype="float32"))


def block_rows(drafter, blocks: RecordedBlocks, scored, head_dtype: str = "bfloat16"):
    """``(p_rows [A + nodes, V] fp32 no grad, draft_logits [Q, V], row_draft [A + nodes])`` of one rollout's
    recorded blocks: the target's logits on every scored row (frozen LM head in ``head_dtype``) and the drafter's q
    at the A anchors recomputed from the rollout's context features (with gradient), in the tree losses' form
    (``drafter.slot_q(...).tree_logits``): DFlash gives its slot logits ``[A * G, V]`` (row ``a * G + k - 1`` =
    slot k at anchor a); DFlash V2 / DSpark give one row per scored row, conditioned on the recorded proposed
    tokens before it (rejected ones included)."""
    from specopd_trainer.loops.head import target_head_logits

    anchors = torch.tensor([x["anchor"] for x in blocks.records], dtype=torch.long)
    pk = blocks.packed
    q = drafter.slot_q(scored.features.float(), torch.tensor(blocks.token_ids, dtype=torch.long), anchors)
    draft, row_draft = q.tree_logits(pk.row_anchor, pk.row_slot, pk.row_path)
    with torch.no_grad():
        p_rows = target_head_logits(drafter._head(), scored.hidden, head_dtype)
    return p_rows, draft, row_draft


def rollout_step(drafter, client, rollouts: List[Rollout], layer_ids: List[int], loss_name: str = "e2e_tv",
                 max_records: Optional[int] = None, head_dtype: str = "bfloat16", temperature: float = 1.0) -> Tuple[torch.Tensor, Dict]:
    """Proposal-tree loss ``loss_name`` (E2E-TV by default) on the recorded blocks of ``rollouts`` (score + features
    in one call); returns (loss, metrics). ``temperature``: the rollouts' sampling temperature (the drafts' law for
    ``e2e_fkl_is``'s acceptance ratios)."""
    from specopd_kernels.losses import expected_acceptance_length, tree_loss_and_alpha

    B = drafter.block_size
    g = B - 1
    kept = []
    for r in rollouts:
        recs = [x for x in r.records if x["anchor"] < len(r.token_ids) and len(x["proposed"]) >= g - 1]
        recs = recs[:max_records]  # None = all
        if recs:  # each verify record is a one-branch proposal tree at its anchor: its proposed tokens but the last
            kept.append(pack_recorded_blocks(r.token_ids, recs, g))
    if not kept:
        raise ValueError("no verify records in these rollouts (is the server speculative?)")
    t0 = time.monotonic()
    scored = score_recorded_blocks(client, kept, B, layer_ids)
    t1 = time.monotonic()
    total, n, taus = 0.0, 0, []
    for blocks, sc in zip(kept, scored):
        a, packed = len(blocks.records), blocks.packed
        p_rows, q, row_draft = block_rows(drafter, blocks, sc, head_dtype)  # [a + nodes, V], [Q, V], [a + nodes]
        # the same proposal-tree loss as SpecOPD (one branch per anchor, so no shared rows)
        loss, alpha = tree_loss_and_alpha(loss_name, p_rows, q, row_draft, packed.row_index,
                                          row_token=packed.row_token, sample_temperature=temperature)
        total = total + loss * a
        n += a
        taus.append(float(expected_acceptance_length(alpha)[1].mean()))
    return total / n, {"est_tau": sum(taus) / len(taus), "supervised_tokens": n * g, "records": n,
                       "score_s": t1 - t0, "loss_s": time.monotonic() - t1}
