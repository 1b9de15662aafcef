"""Target context features captured while serving, kept beside the live-traffic spool (opt-in, byte-bounded).

A drafter trained on served traffic needs, for every served token, the target's hidden states at the drafter's
``target_layer_ids`` (its context features). The SPECOPD worker already computes exactly those rows: SGLang's DFlash
worker captures them (``CaptureHiddenMode.FULL`` with the drafter's layers to capture) in the prompt's prefill and
in every verify forward, and hands them to ``_append_target_hidden_to_draft_kv_by_loc`` to fill the drafter's
context KV. With ``traffic_features_mb > 0`` (server config; ``SPECOPD_TRAFFIC_FEATURES_BYTES``) and the spool on,
the worker also copies the committed rows of every request into it (:func:`capture_prefill`,
:func:`capture_verify`): the prefill's rows for the positions it computed, and after each verify the first
``commit_lens[i]`` rows of request ``i`` (its anchor token and the accepted drafts, whose hidden states were
computed on the verified prefix). When the request finishes and is spooled, :func:`take` assembles the contiguous
rows ``[start, start + rows)`` (``start`` > 0 when SGLang's radix cache served a prefix, whose rows were computed
by an earlier request; the last served token's row is never computed, since nothing was drafted after it) and the
spool keeps them in a :class:`FeatureRing` under their item's ``seq``. So a trainer gets the features of served
traffic without a second prefill (``score_trees`` ``hidden``); only the cached prefix rows, the same for every
request sharing it, need one (``specopd_trainer.adapt.features`` caches those by prefix).

Rows are stored as bfloat16 on the CPU (``K * hidden`` values per token, e.g. 3 x 576 x 2 bytes = 3.4 kB for
SmolLM2 with three layers). Bounds: the ring evicts the oldest features until the budget fits (counted); rows held
for requests still running are bounded by the KV pool (a request's rows are 3 x hidden x 2 bytes per token, less
than its target K/V). ``GET /specopd/traffic/features?seqs=..`` (admin) returns them as safetensors
(:func:`features_reply`). DSpark servers (SPECOPD_DSPARK) do not capture: their traffic items carry no features.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from sglang_specopd.server.traffic.optout import opted_out
from sglang_specopd.wire.traffic import MAX_FEATURE_SEQS_PER_READ as MAX_SEQS_PER_READ
from sglang_specopd.wire.traffic import budget_env, budget_from_env

FEATURES_BYTES_ENV = "SPECOPD_TRAFFIC_FEATURES_BYTES"
OFF_REASON = ("feature capture is off on this server (set traffic_features_mb > 0 and traffic_spool_mb > 0 in its "
              "server config; docs/live_traffic.md)")
_ATTR = "_specopd_feature_rows"  # per request: {start position: CPU bf16 rows [n, D]}
STORE_DTYPE = torch.bfloat16


def features_budget_bytes(environ: Optional[Mapping[str, str]] = None) -> int:
    """The feature ring's byte budget from ``SPECOPD_TRAFFIC_FEATURES_BYTES`` (unset or 0: capture off).
    Raises ValueError when the variable is not an integer >= 0."""
    return budget_from_env(FEATURES_BYTES_ENV, os.environ if environ is None else environ)


def features_env(traffic_features_mb: float) -> Dict[str, str]:
    """The environment that carries ``traffic_features_mb`` (MiB) to the server's processes."""
    return budget_env(FEATURES_BYTES_ENV, "traffic_features_mb", traffic_features_mb)


class FeatureRing:
    """Byte-bounded map ``seq -> (start, rows [n, D])``, oldest evicted first (``counts``: stored, evicted,
    dropped_oversize)."""

    def __init__(self, budget_bytes: int):
        if budget_bytes <= 0:
            raise ValueError(f"the feature ring needs a budget > 0 bytes, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self._items: "OrderedDict[int, Tuple[int, torch.Tensor]]" = OrderedDict()
        self.bytes = 0
        self.counts = {"stored": 0, "evicted": 0, "dropped_oversize": 0}

    def put(self, seq: int, start: int, rows: torch.Tensor) -> bool:
        """Keep ``rows`` for item ``seq``; False (counted) when they alone exceed the budget."""
        size = rows.numel() * rows.element_size()
        if size > self.budget_bytes:
            self.counts["dropped_oversize"] += 1
            return False
        while self._items and self.bytes + size > self.budget_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()
            self.counts["evicted"] += 1
        self._items[int(seq)] = (int(start), rows)
        self.bytes += size
        self.counts["stored"] += 1
        return True

    def get(self, seq: int) -> Optional[Tuple[int, torch.Tensor]]:
        return self._items.get(int(seq))

    def clear(self) -> int:
        n = len(self._items)
        self._items.clear()
        self.bytes = 0
        return n

    def stats(self) -> Dict[str, int]:
        return {"items": len(self._items), "bytes": self.bytes, "budget_bytes": self.budget_bytes, **self.counts}


_RING: Optional[FeatureRing] = None
_OFF = False


def ring() -> Optional[FeatureRing]:
    """This process's feature ring (created on first use); None when capture is off."""
    global _RING, _OFF
    if _RING is None and not _OFF:
        budget = features_budget_bytes()
        if budget > 0:
            _RING = FeatureRing(budget)
        else:
            _OFF = True
    return _RING


def capturing() -> bool:
    """True when this server captures features (``SPECOPD_TRAFFIC_FEATURES_BYTES`` > 0)."""
    return ring() is not None


def _add(req: Any, start: int, rows: torch.Tensor) -> None:
    held = getattr(req, _ATTR, None)
    if held is None:
        held = {}
        setattr(req, _ATTR, held)
    held[int(start)] = rows.detach().to(device="cpu", dtype=STORE_DTYPE).clone()


def capture_prefill(reqs: Sequence[Any], hidden: torch.Tensor, positions: torch.Tensor,
                    extend_lens: Sequence[int]) -> None:
    """Keep a prefill's rows: ``hidden [sum(extend_lens), K*H]`` (any float dtype/device), ``positions`` (the
    absolute position of each row), ``extend_lens`` rows per request, row-aligned with ``reqs``. A batch whose
    shapes disagree is skipped (its requests then carry no features)."""
    lens = [int(n) for n in extend_lens]
    if len(lens) != len(reqs) or sum(lens) > int(hidden.shape[0]) or int(positions.numel()) < sum(lens):
        for r in reqs:
            discard(r)
        return
    starts = positions.detach().to("cpu").view(-1).tolist()
    off = 0
    for req, n in zip(reqs, lens):
        if n > 0 and not opted_out(req):
            _add(req, starts[off], hidden[off:off + n])
        off += n


def capture_verify(reqs: Sequence[Any], hidden: torch.Tensor, positions: torch.Tensor, commit_lens: torch.Tensor,
                   block_size: int) -> None:
    """Keep a verify step's committed rows: ``hidden [bs * block_size, K*H]``, ``positions [bs * block_size]``,
    ``commit_lens [bs]`` (accepted drafts + 1): request ``i`` keeps rows ``i*B .. i*B + commit_lens[i] - 1``."""
    bs = len(reqs)
    if int(hidden.shape[0]) < bs * block_size or int(positions.numel()) < bs * block_size:
        for r in reqs:
            discard(r)
        return
    commits = commit_lens.detach().to("cpu").view(-1).tolist()
    starts = positions.detach().to("cpu").view(-1)[::block_size].tolist()
    for i, req in enumerate(reqs):
        n = int(commits[i]) if i < len(commits) else 0
        if n > 0 and not opted_out(req):
            _add(req, starts[i], hidden[i * block_size:i * block_size + n])


def discard(req: Any) -> None:
    """Drop a request's captured rows (aborted, or a batch that could not be captured)."""
    if getattr(req, _ATTR, None) is not None:
        setattr(req, _ATTR, None)


def take(req: Any, length: int) -> Optional[Tuple[int, torch.Tensor]]:
    """The request's rows ``(start, [length - 1 - start, K*H])`` for positions ``start .. length - 2`` (every
    position but the last served token's, whose row is never computed), and forget them. None when nothing was
    captured or a position in that range has no row. Later chunks overwrite earlier rows of the same positions
    (e.g. a request prefilled again after a retraction)."""
    held = getattr(req, _ATTR, None)
    setattr(req, _ATTR, None)
    if not held:
        return None
    end = max(0, int(length) - 1)
    by_pos: Dict[int, torch.Tensor] = {}
    for first in sorted(held):
        rows = held[first]
        for j in range(min(rows.shape[0], max(0, end - first))):
            by_pos[first + j] = rows[j]
    if not by_pos:
        return None
    start = min(by_pos)
    if any(p not in by_pos for p in range(start, end)):
        return None
    return start, torch.stack([by_pos[p] for p in range(start, end)])


def store_finished(req: Any, seq: Optional[int], length: int) -> Optional[Dict[str, int]]:
    """After the spool added item ``seq`` for ``req`` (None: not added): keep its rows in the ring. Returns the
    item's ``features`` field ``{"start", "rows"}`` or None."""
    feats = take(req, length)
    rg = ring()
    if feats is None or seq is None or rg is None:
        return None
    start, rows = feats
    if not rg.put(seq, start, rows):
        return None
    return {"start": start, "rows": int(rows.shape[0])}


def parse_seqs(query: Mapping[str, str]) -> Tuple[List[int], Optional[str]]:
    """``?seqs=1,2,3&spool_id=ID`` -> (seqs, spool_id); ValueError (HTTP 400) for unknown parameters, a missing or
    malformed list, more than :data:`MAX_SEQS_PER_READ` seqs, or values outside 1..2**62."""
    unknown = sorted(set(query) - {"seqs", "spool_id"})
    if unknown:
        raise ValueError(f"unknown query parameter(s) {unknown[:5]} (allowed: seqs, spool_id)")
    raw = (query.get("seqs") or "").strip()
    if not raw:
        raise ValueError("seqs is required: a comma-separated list of item seqs")
    parts = raw.split(",")
    if len(parts) > MAX_SEQS_PER_READ:
        raise ValueError(f"at most {MAX_SEQS_PER_READ} seqs per read, got {len(parts)}")
    seqs = []
    for p in parts:
        try:
            v = int(p)
        except ValueError:
            raise ValueError(f"seqs must be integers, got {p[:20]!r}") from None
        if not 1 <= v <= 2**62:
            raise ValueError(f"seqs must be in 1..{2**62}, got {v}")
        seqs.append(v)
    return seqs, query.get("spool_id") or None


def features_reply(seqs: Sequence[int], spool_id: str) -> bytes:
    """Safetensors bytes: tensor ``feat.<seq>`` (bf16 ``[rows, K*H]``) per held seq; metadata ``{"spool_id",
    "start": {seq: position of the first row}, "missing": [seqs without features]}`` (JSON strings)."""
    from safetensors.torch import save

    rg = ring()
    tensors, start, missing = {}, {}, []
    for s in seqs:
        got = rg.get(s) if rg is not None else None
        if got is None:
            missing.append(int(s))
            continue
        start[str(int(s))] = got[0]
        tensors[f"feat.{int(s)}"] = got[1].contiguous()
    meta = {"spool_id": spool_id, "start": json.dumps(start), "missing": json.dumps(missing)}
    return save(tensors, metadata=meta)
