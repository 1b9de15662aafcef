"""Checks shared by the replay parity tests (Draft-OPD against SPECOPD servers with DFlash and V2 drafters, and
against a SPECOPD_DSPARK one)."""

from __future__ import annotations

from typing import List, Sequence


def p_disagrees(record, top: Sequence[int], g: int) -> bool:
    """Whether the target's argmax tokens ``top`` at a recorded block's slots (T=0 scoring rows, slot 1 first)
    contradict the verify decision the server traced: the argmax must equal the proposal on every accepted slot and
    differ from it at the first rejected one (``record``: ``proposed``, ``accepted``; ``g`` drafts per block)."""
    acc = min(int(record.accepted), g)
    proposed: List[int] = list(record.proposed)
    return list(top[:acc]) != proposed[:acc] or (acc < g and top[acc] == proposed[acc])


def check_replay(rows, g: int) -> int:
    """Assert, for every ``(record, replayed, top)`` of ``rows``, that the replayed drafter's block equals the one
    the server proposed and that the target rows agree with the verify decision (:func:`p_disagrees`); returns
    how many records were checked. The failure message lists the first three of each kind."""
    checked, mismatches, p_mismatches = 0, [], []
    for x, mine, top in rows:
        checked += 1
        if list(mine) != list(x.proposed):
            mismatches.append((x.anchor, list(x.proposed), list(mine)))
        if p_disagrees(x, top, g):
            p_mismatches.append((x.anchor, x.accepted, list(x.proposed), list(top)))
    assert not mismatches, f"{len(mismatches)}/{checked} recorded blocks differ (anchor, server, replay): " \
                           f"{mismatches[:3]}"
    assert not p_mismatches, f"{len(p_mismatches)}/{checked} blocks: target p misaligned with the verify " \
                             f"(anchor, accepted, proposed, argmax p): {p_mismatches[:3]}"
    return checked


def replay_served_blocks(client, drafter, prompts: Sequence[List[int]], *, block_size: int, new_tokens: int,
                         version: str):
    """Draft-OPD's live rollouts of ``prompts`` at T = 0 through ``client``'s server (every record must carry
    ``version``), their recorded blocks scored in one ``score_trees`` call, and :func:`check_replay` on them:
    ``drafter.propose`` on the returned context features must give the served block at every recorded anchor, and
    the target rows must agree with every verify decision. Returns ``(rollouts, records checked)``."""
    import torch

    from specopd_trainer.algorithms.draft_opd.rollouts import live_source
    from specopd_trainer.algorithms.sequential_opd.rollouts import (block_rows, pack_recorded_blocks,
                                                                    score_recorded_blocks)

    g, layers = block_size - 1, list(drafter.spec.target_layer_ids)
    source = live_source(client, prompts, block_size=block_size, rollout_prompts=len(prompts),
                         max_new_tokens=new_tokens, temperature=0.0, concurrency=len(prompts))
    rollouts = source(torch.Generator().manual_seed(0))
    assert rollouts and all(r.records for r in rollouts)
    assert {x.drafter_version for r in rollouts for x in r.records} == {version}
    blocks = [pack_recorded_blocks(r.token_ids, [x.as_dict() for x in r.records], g) for r in rollouts]
    scored = score_recorded_blocks(client, blocks, block_size, layers)
    rows = []
    with torch.no_grad():
        for r, b, sc in zip(rollouts, blocks, scored):
            feats = sc.features.float()
            p_rows, _, _ = block_rows(drafter, b, sc, "float32")
            p_top = p_rows.argmax(-1)[b.packed.row_index].tolist()
            rows += [(x, drafter.propose(feats[:x.anchor], r.token_ids[x.anchor], x.anchor).tolist(), top)
                     for x, top in zip(r.records, p_top)]
    return rollouts, check_replay(rows, g)
