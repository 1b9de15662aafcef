"""Checks shared by the replay parity tests (Draft-OPD against a SPECOPD server, and against a SPECOPD_DSPARK one)."""

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
