"""Reading the live-traffic spool for ``specopd adapt``: a persisted cursor, items validated one by one, the held-out
slice.

:class:`TrafficReader` asks for raw pages (``SpecOPDClient.traffic_page``) and validates every item on its own with the
wire model (:class:`sglang_specopd.wire.traffic.TrafficItem`, strict) plus the checks training needs (a prompt and
at least two served tokens, ids inside the vocabulary, trace anchors inside the sequence, not longer than
``max_item_tokens``): an item that fails is counted under its reason and skipped, never raised, so one malformed or
truncated spool item cannot stop the adapter. A page whose envelope is malformed (no ``items`` list, no integer
``next_after``) is counted (``bad_pages``) and read again after the poll interval.

Held out: an item whose prompt's hash is divisible by ``holdout_every`` (:func:`specopd_trainer.adapt.slices.held_out`:
~1/k of the distinct prompts; a prompt the traffic repeats is always on the same side, never both trained on and
held out). The decision depends on the prompt alone, so it is the same after a resume, a re-read or on another
fleet worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from pydantic import ValidationError

from specopd_trainer.adapt.slices import held_out


@dataclass
class Cursor:
    """Where the next read starts: the spool's id (None before the first read) and the last seq read."""

    spool_id: Optional[str] = None
    after: int = 0

    def as_dict(self) -> Dict[str, Any]:
        return {"spool_id": self.spool_id, "after": self.after}


@dataclass(frozen=True)
class ServedItem:
    """One valid served request: its key (``<spool_id>:<seq>``), ids (prompt + served output), prompt length, verify
    records (dicts as served), the drafter versions that proposed for it, the captured-features span (or None),
    whether it is held out, when it finished (Unix s) and the worker that served it (None: the one server)."""

    key: str
    seq: int
    input_ids: List[int]
    prompt_len: int
    trace: List[dict]
    features: Optional[Dict[str, int]]
    held_out: bool
    finished_at: float = 0.0
    worker: Optional[str] = None

    @property
    def versions(self) -> List[str]:
        return sorted({str(r["drafter_version"]) for r in self.trace})

    @property
    def response_tokens(self) -> int:
        return len(self.input_ids) - self.prompt_len


@dataclass
class ReaderCounts:
    """Counters of everything read (persisted in the adapter's state)."""

    items: int = 0  # valid items read
    held_out: int = 0
    bad_items: Dict[str, int] = field(default_factory=dict)  # reason -> count
    bad_pages: int = 0
    missed: int = 0  # evicted from the spool before this reader got them (the server's count)
    spool_restarts: int = 0  # the server's spool id changed (a restart): reading starts again at its first item
    unavailable: int = 0  # fleet: reads skipped because a worker did not answer (its cursor stayed)
    by_worker: Dict[str, int] = field(default_factory=dict)  # fleet: valid items read per worker

    def bad(self, reason: str) -> None:
        self.bad_items[reason] = self.bad_items.get(reason, 0) + 1

    @property
    def bad_total(self) -> int:
        return sum(self.bad_items.values())


def check_item(raw: Any, *, vocab_size: int, max_item_tokens: int) -> Optional[str]:
    """Why ``raw`` (one item of a traffic page) cannot be trained on, or None. Reasons: ``malformed`` (fails the
    strict wire model), ``truncated`` (``prompt_len`` beyond the ids), ``no_response`` (fewer than 2 served tokens),
    ``no_prompt``, ``token_out_of_vocab``,
    ``too_long``, ``trace_out_of_range`` (a verify record's anchor outside the sequence)."""
    from sglang_specopd.wire.traffic import TrafficItem

    try:
        item = TrafficItem.model_validate(raw)
    except (ValidationError, TypeError, ValueError):
        return "malformed"
    n = len(item.input_ids)
    if item.prompt_len > n:
        return "truncated"
    if item.prompt_len < 1:
        return "no_prompt"
    if n - item.prompt_len < 2:
        return "no_response"
    if n > max_item_tokens:
        return "too_long"
    if any(not 0 <= t < vocab_size for t in item.input_ids):
        return "token_out_of_vocab"
    if any(not item.prompt_len - 1 <= r.anchor < n for r in item.trace):
        return "trace_out_of_range"
    if item.features is not None and item.features.start + item.features.rows > n:
        return "malformed"
    return None


class TrafficReader:
    """Pages through the spool of the server behind ``client`` from ``cursor`` (updated in place).

    Args:
        client: :class:`specopd_trainer.client.http.SpecOPDClient` with the admin key. cursor: where to start.
        counts: counters to update (persisted by the caller). holdout_every: k of the held-out share (by prompt hash).
        vocab_size: the target's vocabulary (ids outside are refused). max_items: per read (1..4096).
    """

    def __init__(self, client, cursor: Cursor, counts: ReaderCounts, *, holdout_every: int, vocab_size: int,
                 max_items: int = 64, max_item_tokens: int = 4096):
        if holdout_every < 2:
            raise ValueError(f"holdout_every must be >= 2, got {holdout_every}")
        self.client, self.cursor, self.counts = client, cursor, counts
        self.holdout_every, self.vocab_size = holdout_every, vocab_size
        self.max_items, self.max_item_tokens = max_items, max_item_tokens
        self.backlog = 0  # items the server held after the last read's cursor

    def read(self) -> List[ServedItem]:
        """The valid items after the cursor (up to ``max_items`` read), oldest first; advances the cursor."""
        page = self.client.traffic_page(self.cursor.after, self.cursor.spool_id, self.max_items)
        items, nxt, spool_id = page.get("items"), page.get("next_after"), page.get("spool_id")
        if not isinstance(items, list) or not isinstance(nxt, int) or not isinstance(spool_id, str):
            self.counts.bad_pages += 1
            return []
        if self.cursor.spool_id is not None and spool_id != self.cursor.spool_id:
            self.counts.spool_restarts += 1
        missed = page.get("missed")
        self.counts.missed += missed if isinstance(missed, int) and missed > 0 else 0
        stats = page.get("stats") if isinstance(page.get("stats"), dict) else {}
        newest = stats.get("newest_seq")
        self.backlog = max(0, newest - nxt) if isinstance(newest, int) else 0
        out: List[ServedItem] = []
        for raw in items:
            reason = check_item(raw, vocab_size=self.vocab_size, max_item_tokens=self.max_item_tokens)
            if reason is not None:
                self.counts.bad(reason)
                continue
            seq = int(raw["seq"])
            held = held_out(raw["input_ids"][:int(raw["prompt_len"])], self.holdout_every)
            out.append(ServedItem(key=f"{spool_id}:{seq}", seq=seq, input_ids=[int(t) for t in raw["input_ids"]],
                                  prompt_len=int(raw["prompt_len"]), trace=list(raw["trace"]),
                                  features=raw.get("features"), held_out=held,
                                  finished_at=float(raw["finished_at"])))
            self.counts.items += 1
            self.counts.held_out += int(held)
        self.cursor.spool_id, self.cursor.after = spool_id, nxt
        return out

    def skip_to_newest(self) -> None:
        """Move the cursor past everything the spool holds now (a new run's ``start_at: newest``)."""
        page = self.client.traffic_page(0, None, 1)
        stats = page.get("stats") if isinstance(page.get("stats"), dict) else {}
        if isinstance(page.get("spool_id"), str) and isinstance(stats.get("newest_seq"), int):
            self.cursor.spool_id, self.cursor.after = page["spool_id"], stats["newest_seq"]
