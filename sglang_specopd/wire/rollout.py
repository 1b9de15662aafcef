"""Wire format of the two-phase drafter rollout (``/specopd/drafter/stage|commit|abort``; admin key).

A rollout to a fleet of SPECOPD workers is a transaction: the trainer stages the new drafter on every worker
(validated exactly as ``POST /specopd/drafter/swap`` validates it, then held beside the serving drafter, not
serving), and commits on every worker only when every stage succeeded (otherwise it aborts on all). See
``docs/fleet_rollout.md``.

* ``POST /specopd/drafter/stage?txn=ID[&ttl_s=S]``: the body is a swap body (safetensors bytes of
  :func:`sglang_specopd.wire.protocol.swap_payload`, or JSON ``{"path": DIR, "version": str}``). 200
  :class:`StageReply`; 400 for a refused drafter or a bad query; 409 when another transaction is staged (or a
  one-phase swap is refused for the same reason). Staging again under the same ``txn`` replaces the staged copy (a
  retried request is harmless). The staged copy is dropped after ``ttl_s`` seconds (default
  ``SPECOPD_STAGE_TTL_S``, else :data:`DEFAULT_STAGE_TTL_S`; at most :data:`MAX_STAGE_TTL_S`).
* ``POST /specopd/drafter/commit`` and ``/abort``: JSON ``{"txn": ID}`` (:class:`TxnRequest`, at most
  :data:`TXN_BODY_MAX_BYTES` bytes). Commit: 200 :class:`CommitReply` (also for a retried commit of the
  transaction that was committed last: ``already_committed``), 409 when ``txn`` is not staged (never was, expired,
  aborted, or another one is). Abort: 200 :class:`AbortReply` always (``aborted`` false when ``txn`` was not staged:
  another transaction's staged copy is never dropped).

Transaction ids: 1..:data:`TXN_ID_MAX_LEN` characters of ``[A-Za-z0-9._:-]``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

STAGE_DRAFTER_PATH = "/specopd/drafter/stage"  # POST (admin): ?txn=ID&ttl_s=S, body: a swap body
COMMIT_DRAFTER_PATH = "/specopd/drafter/commit"  # POST (admin): {"txn": ID}
ABORT_DRAFTER_PATH = "/specopd/drafter/abort"  # POST (admin): {"txn": ID}

STAGE_TTL_ENV = "SPECOPD_STAGE_TTL_S"
DEFAULT_STAGE_TTL_S = 300.0
MAX_STAGE_TTL_S = 3600.0
MIN_STAGE_TTL_S = 0.1
TXN_ID_MAX_LEN = 64
TXN_BODY_MAX_BYTES = 1024
_TXN_RE = re.compile(r"[A-Za-z0-9._:-]+")
_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


def check_txn_id(value: object) -> str:
    """``value`` if it is a transaction id (a str of 1..64 characters of ``[A-Za-z0-9._:-]``); else ValueError."""
    if not isinstance(value, str) or not 0 < len(value) <= TXN_ID_MAX_LEN or not _TXN_RE.fullmatch(value):
        shown = repr(value)[:40]
        raise ValueError(f"txn must be 1..{TXN_ID_MAX_LEN} characters of [A-Za-z0-9._:-], got {shown}")
    return value


def check_ttl(value: float, what: str = "ttl_s") -> float:
    """``value`` (seconds) if finite and within [:data:`MIN_STAGE_TTL_S`, :data:`MAX_STAGE_TTL_S`]; else ValueError."""
    if not (MIN_STAGE_TTL_S <= value <= MAX_STAGE_TTL_S):  # NaN fails too
        raise ValueError(f"{what} must be in {MIN_STAGE_TTL_S:g}..{MAX_STAGE_TTL_S:g} seconds, got {value!r}")
    return float(value)


def default_ttl(environ: Mapping[str, str]) -> float:
    """The stage timeout when a stage names none: ``SPECOPD_STAGE_TTL_S`` (seconds) or :data:`DEFAULT_STAGE_TTL_S`.
    Raises ValueError for a value that is not a number in range (the server refuses to start with it)."""
    raw = environ.get(STAGE_TTL_ENV, "").strip()
    if not raw:
        return DEFAULT_STAGE_TTL_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{STAGE_TTL_ENV} must be a number of seconds, got {raw[:40]!r}") from None
    return check_ttl(value, STAGE_TTL_ENV)


@dataclass(frozen=True)
class StageParams:
    """A stage request's query: the transaction id and its timeout in seconds."""

    txn: str
    ttl_s: float


def parse_stage_query(query: Mapping[str, str], default_ttl_s: float) -> StageParams:
    """``?txn=ID&ttl_s=S`` -> :class:`StageParams` (``ttl_s`` defaults to ``default_ttl_s``). ValueError (HTTP 400)
    with the reason for an unknown or missing parameter, a bad id or a timeout out of range."""
    unknown = sorted(set(query) - {"txn", "ttl_s"})
    if unknown:
        raise ValueError(f"unknown query parameter(s) {[u[:40] for u in unknown[:5]]} (allowed: txn, ttl_s)")
    if "txn" not in query:
        raise ValueError("missing query parameter txn (the rollout transaction id)")
    txn = check_txn_id(query["txn"])
    raw = query.get("ttl_s")
    if raw is None:
        return StageParams(txn, check_ttl(default_ttl_s))
    try:
        ttl = float(raw)
    except ValueError:
        raise ValueError(f"ttl_s must be a number of seconds, got {raw[:40]!r}") from None
    return StageParams(txn, check_ttl(ttl))


class TxnRequest(BaseModel):
    """The body of commit and abort: ``{"txn": ID}``."""

    model_config = _STRICT

    txn: str

    @field_validator("txn")
    @classmethod
    def _txn(cls, v: str) -> str:
        return check_txn_id(v)


def parse_txn_body(body: bytes) -> str:
    """The transaction id of a commit / abort body (strict JSON ``{"txn": ID}``, at most
    :data:`TXN_BODY_MAX_BYTES` bytes); ValueError with the reason otherwise."""
    from sglang_specopd.wire.strict_json import loads

    if len(body) > TXN_BODY_MAX_BYTES:
        raise ValueError(f"body of {len(body)} bytes exceeds {TXN_BODY_MAX_BYTES} bytes (send {{\"txn\": ID}})")
    data = loads(body, what="the transaction body", max_depth=2)
    try:
        return TxnRequest.model_validate(data).txn
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ValueError(f'the body must be {{"txn": ID}}: {where}: {first["msg"]}') from None


def stage_op_payload(params: StageParams, body: bytes) -> bytes:
    """The scheduler op's payload: one JSON line ``{"txn", "ttl_s"}`` then the swap body as sent."""
    return json.dumps({"txn": params.txn, "ttl_s": params.ttl_s}).encode() + b"\n" + body


def split_stage_payload(payload: bytes) -> Tuple[StageParams, bytes]:
    """Inverse of :func:`stage_op_payload`."""
    head, _, body = payload.partition(b"\n")
    meta = json.loads(head)
    return StageParams(check_txn_id(meta["txn"]), check_ttl(float(meta["ttl_s"]))), body


class StagedInfo(BaseModel):
    """The transaction staged on a worker (``GET /specopd/drafter``'s ``staged``; null when none)."""

    model_config = _STRICT

    txn: str
    version: str
    expires_in_s: float


class StageReply(BaseModel):
    """200 of a stage: the staged transaction, its version and what still serves (``serving_version``)."""

    model_config = _STRICT

    txn: str
    version: str
    serving_version: str
    ttl_s: float = Field(gt=0)
    expires_in_s: float
    replaced: bool  # a staged copy of the same txn was replaced (a retried stage)


class CommitReply(BaseModel):
    """200 of a commit: the version now serving and the one it replaced (``already_committed``: a retry of the
    last committed transaction; nothing changed then)."""

    model_config = _STRICT

    txn: str
    version: str
    previous_version: str
    swaps: int = Field(ge=0)
    cache_flushed: bool
    already_committed: bool = False


class AbortReply(BaseModel):
    """200 of an abort: whether ``txn``'s staged copy was dropped, and the (unchanged) serving version."""

    model_config = _STRICT

    txn: str
    aborted: bool
    version: str
    staged: Optional[StagedInfo] = None  # another transaction still staged, if any
