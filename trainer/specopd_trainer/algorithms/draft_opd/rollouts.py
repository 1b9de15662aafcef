"""Draft-OPD's rollout sources: verify records of real speculative decoding, from live rollouts or served traffic.

A rollout source is a function ``source(gen) -> List[TracedRollout]`` (``gen``: the step's torch.Generator, so a
resumed run draws what the uninterrupted one drew). Two implementations:

- :func:`live_source`: the step's prompts rolled out through the live SPECOPD server with the current drafter,
  all requests in flight at once (a pool of ``concurrency``), with per-request acceptance traces
  (:func:`specopd_trainer.algorithms.sequential_opd.rollouts.collect_rollouts`);
- :func:`traffic_source`: the requests the server served and recorded (``client.traffic(max_items)``, items
  ``{"input_ids", "prompt_len", "trace"}``), optionally purged after each read (``client.purge_traffic()``).

Every verify record keeps the anchor, the proposed block (block_size - 1 ids), the accepted count, the first
rejected slot (accepted + 1 when accepted < block_size - 1, else None) and the version of the drafter that
proposed it (the record's ``drafter_version``; when a live record has none and the request was served by one
drafter version only, that version).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch


@dataclass(frozen=True)
class VerifyRecord:
    """One verify step. anchor: position of the last verified token; proposed: the drafted ids for anchor+1..;
    accepted: leading drafts the target accepted (0..G); first_rejected: 1-based slot of the first rejected draft
    (accepted + 1) or None when all G were accepted; drafter_version: who proposed it (None: unknown)."""

    anchor: int
    proposed: Tuple[int, ...]
    accepted: int
    first_rejected: Optional[int]
    drafter_version: Optional[str]

    def as_dict(self) -> dict:
        """The server's record form (``anchor``, ``proposed``, ``accepted``) plus the other fields."""
        return {"anchor": self.anchor, "proposed": list(self.proposed), "accepted": self.accepted,
                "first_rejected": self.first_rejected, "drafter_version": self.drafter_version}


@dataclass(frozen=True)
class TracedRollout:
    """One served sequence: token ids (prompt + output), prompt length, its verify records."""

    token_ids: List[int]
    prompt_len: int
    records: List[VerifyRecord]


RolloutSource = Callable[[torch.Generator], List[TracedRollout]]


def verify_records(trace: Sequence[dict], block_size: int,
                   request_versions: Sequence[str] = ()) -> List[VerifyRecord]:
    """:class:`VerifyRecord` list of a server trace (records ``{"anchor", "proposed", "accepted"}`` and, from servers
    that record it, ``"drafter_version"``). A record without a version takes the request's when
    ``request_versions`` names exactly one. Records whose accepted count lies outside [0, len(proposed)] are
    skipped (malformed). A record with ``"verified": k`` (the goodput policy checked only k proposals) has no
    first rejected slot when all k were accepted."""
    g = block_size - 1
    fallback = request_versions[0] if len(set(request_versions)) == 1 else None
    out = []
    for x in trace:
        proposed, acc = tuple(int(t) for t in x.get("proposed", ())), int(x.get("accepted", -1))
        if not 0 <= acc <= len(proposed):
            continue
        version = x.get("drafter_version", fallback)
        verified = x.get("verified")  # the goodput policy may verify fewer than all proposals
        checked = min(g, len(proposed), g if verified is None else int(verified))
        out.append(VerifyRecord(int(x["anchor"]), proposed, acc, acc + 1 if acc < checked else None,
                                None if version is None else str(version)))
    return out


def live_source(client, prompts: Sequence[List[int]], *, block_size: int, rollout_prompts: int,
                max_new_tokens: int, temperature: float, concurrency: int,
                share: Tuple[int, int] = (0, 1)) -> RolloutSource:
    """Per call: ``rollout_prompts`` prompts drawn with the step's generator, generated concurrently (at most
    ``concurrency`` requests in flight) through the live server at ``temperature`` with traces. ``share`` =
    (rank, world): only the draws ``rank, rank + world, ...`` are rolled out (a rank's share under torchrun).
    Raises ValueError for an empty ``prompts``."""
    from concurrent.futures import ThreadPoolExecutor

    if not prompts:
        raise ValueError("no prompts")

    def one(p):
        out = client.generate(p, max_new_tokens=max_new_tokens, temperature=temperature, trace=True)
        meta = out.get("meta_info") or {}
        recs = verify_records(meta.get("specopd_trace") or [], block_size, meta.get("specopd_drafter_versions") or ())
        return TracedRollout(list(p) + list(out["output_ids"]), len(p), recs)

    def source(gen: torch.Generator) -> List[TracedRollout]:
        idx = torch.randint(len(prompts), (rollout_prompts,), generator=gen).tolist()[share[0]::share[1]]
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(pool.map(one, [prompts[i] for i in idx]))

    return source


class TrafficSource:
    """Per call: up to ``max_items`` recorded traffic items (``client.traffic(max_items)``), then
    ``client.purge_traffic()`` when ``purge``. Items without ``input_ids`` or with a ``prompt_len`` outside
    the sequence are skipped. (Traffic is what clients sent: the generator is not used.)

    :attr:`backlog` is how many items the server held after the last read's cursor (its ``stats.newest_seq``
    minus the reply's ``next_after``; 0 after a purge or with a client that does not say): a reader that finds
    only stale records reads on at once while there is a backlog instead of waiting for new traffic (on a busy
    server, traffic recorded during a training step outruns one read per poll interval)."""

    def __init__(self, client, *, block_size: int, max_items: int, purge: bool = True):
        self.client, self.block_size, self.max_items, self.purge = client, block_size, max_items, purge

    @property
    def backlog(self) -> int:
        """Items recorded after the last read's cursor and not yet read (0 when unknown)."""
        reply = getattr(self.client, "last_traffic", None)
        if self.purge or reply is None:
            return 0
        return max(0, int(reply.stats.newest_seq) - int(reply.next_after))

    def __call__(self, gen: torch.Generator) -> List[TracedRollout]:
        items = self.client.traffic(self.max_items)
        if self.purge:
            self.client.purge_traffic()
        out = []
        for it in items:
            ids, plen = list(it.get("input_ids") or []), int(it.get("prompt_len", -1))
            if not ids or not 0 < plen <= len(ids):
                continue
            out.append(TracedRollout(ids, plen, verify_records(it.get("trace") or [], self.block_size)))
        return out


def traffic_source(client, *, block_size: int, max_items: int, purge: bool = True) -> TrafficSource:
    """The recorded-traffic rollout source (:class:`TrafficSource`)."""
    return TrafficSource(client, block_size=block_size, max_items=max_items, purge=purge)
