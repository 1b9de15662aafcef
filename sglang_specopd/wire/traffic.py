"""Wire models of the live-traffic spool (``GET /specopd/traffic``, ``POST /specopd/traffic/purge``; admin key).

A server started with ``traffic_spool_mb > 0`` (server config) keeps, for every generation request it finished
(``/generate`` and the OpenAI API; finish reason ``stop`` or ``length``, aborted requests are not kept), one
:class:`TrafficItem` in a ring buffer with a byte budget (oldest items evicted first). Readers page through it
with a cursor: ``GET /specopd/traffic?after=SEQ&max_items=N`` returns up to N items whose ``seq`` is above SEQ,
oldest first, without removing them (a lost reply is simply asked for again), and ``next_after`` is the cursor
for the next call; ``missed`` counts the items evicted (or purged) before this reader got them. ``spool_id``
changes when the server restarts: a cursor from another spool starts again at 0.
See ``docs/live_traffic.md``. Strict pydantic models (no type coercion, unknown keys rejected).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, model_serializer

TRAFFIC_PATH = "/specopd/traffic"  # GET (admin): ?after=SEQ&max_items=N
TRAFFIC_PURGE_PATH = "/specopd/traffic/purge"  # POST (admin): drop every item
TRAFFIC_FEATURES_PATH = "/specopd/traffic/features"  # GET (admin): ?seqs=1,2,..: features captured while serving
MAX_FEATURE_SEQS_PER_READ = 64
MAX_ITEMS_PER_READ = 4096  # max_items accepted by one GET
DEFAULT_ITEMS_PER_READ = 256
MAX_REPLY_BYTES = 32 * 2**20  # one GET returns items up to this many bytes of JSON (always at least one item)

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


def budget_from_env(name: str, environ: Mapping[str, str]) -> int:
    """A byte budget from environment variable ``name`` (unset or empty: 0). Raises ValueError when it is not an
    integer >= 0."""
    raw = environ.get(name, "").strip()
    try:
        value = int(raw) if raw else 0
    except ValueError:
        raise ValueError(f"{name} must be an integer >= 0, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def budget_env(name: str, key: str, mib: float) -> Dict[str, str]:
    """``{name: bytes}`` for a budget of ``mib`` MiB (fractions allowed) set by config key ``key``; ValueError < 0."""
    if mib < 0:
        raise ValueError(f"{key} must be >= 0, got {mib}")
    return {name: str(int(mib * 2**20))}


class TraceRecord(BaseModel):
    """One verify step of a request (``meta_info["specopd_trace"]`` has the same records): the anchor position (the
    last verified token), the drafter's ``block_size - 1`` proposed token ids for positions ``anchor+1 ...``, how many
    leading proposals the target accepted, and the version of the drafter that proposed the block."""

    model_config = _STRICT

    anchor: int = Field(ge=0)
    proposed: List[int]
    accepted: int = Field(ge=0)
    drafter_version: str
    verified: Optional[int] = Field(default=None, ge=0)  # leading proposals the target checked, when fewer than all

    @model_serializer(mode="wrap")
    def _without_unset_verified(self, handler):
        """Records of whole-block steps serialize as before (no ``verified`` key)."""
        out = handler(self)
        if isinstance(out, dict) and out.get("verified") is None:
            out.pop("verified", None)
        return out


class TrafficFeatures(BaseModel):
    """Where an item's context features (captured while serving, ``GET /specopd/traffic/features``) start: rows for
    positions ``start .. start + rows - 1`` of ``input_ids`` (``start`` > 0 when a cached prefix was not recomputed;
    ``start + rows = len(input_ids) - 1``: the last served token's row is never computed)."""

    model_config = _STRICT

    start: int = Field(ge=0)
    rows: int = Field(ge=1)


class TrafficItem(BaseModel):
    """One served request: ``input_ids`` = prompt ids + output ids (as returned to the user; ``prompt_len`` of them
    are the prompt), its verify steps, when it finished (Unix time, seconds) and its position ``seq`` in the spool
    (1, 2, ... in finishing order, never reused while the server runs)."""

    model_config = _STRICT

    seq: int = Field(ge=1)
    input_ids: List[int]
    prompt_len: int = Field(ge=0)
    trace: List[TraceRecord]
    finished_at: float
    features: Optional[TrafficFeatures] = None


class TrafficStats(BaseModel):
    """The spool's state: items and bytes held (bytes = their JSON encoding), the budget, and counters since start:
    items recorded, evicted (budget), dropped_oversize (one item over the whole budget), purged."""

    model_config = _STRICT

    items: int = Field(ge=0)
    bytes: int = Field(ge=0)
    budget_bytes: int = Field(ge=0)
    recorded: int = Field(ge=0)
    evicted: int = Field(ge=0)
    dropped_oversize: int = Field(ge=0)
    purged: int = Field(ge=0)
    oldest_seq: int = Field(ge=0)  # 0 when empty
    newest_seq: int = Field(ge=0)  # the last seq assigned (0 before the first item)


class TrafficReply(BaseModel):
    """``GET /specopd/traffic``: the items after the cursor (oldest first), the next cursor, how many items after the
    cursor were lost before this read (evicted or purged), the spool's id and stats."""

    model_config = _STRICT

    spool_id: str
    items: List[TrafficItem]
    next_after: int = Field(ge=0)
    missed: int = Field(ge=0)
    stats: TrafficStats


class PurgeReply(BaseModel):
    """``POST /specopd/traffic/purge``: how many items were dropped, and the stats after."""

    model_config = _STRICT

    purged: int = Field(ge=0)
    stats: TrafficStats
