"""The staged drafter of a rollout transaction (scheduler side): at most one per server, with a deadline.

State only (no SGLang, no HTTP): :mod:`sglang_specopd.server.drafter.rollout` runs the stage / commit / abort ops on it,
:mod:`sglang_specopd.server.drafter.swap` reads it (a one-phase swap is refused while a transaction is staged; ``GET
/specopd/drafter`` shows the staged one). Every access first drops a staged copy whose deadline passed
(:func:`current`), so an expired transaction can never be committed, whatever the HTTP side's expiry timer did.
Times are ``time.monotonic()`` seconds of the scheduler process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, Optional


class TxnConflict(Exception):
    """A transaction op that conflicts with the server's transaction state (HTTP 409 with this message)."""

    control_status = 409  # what the control channel (:func:`sglang_specopd.server.control.handle_control`) replies


@dataclass(frozen=True)
class Staged:
    """A validated drafter held beside the serving one.

    Attributes:
        txn: the transaction id.
        version: the version the drafter will serve under once committed.
        tensors: ``{checkpoint tensor name: tensor}`` on the draft model's device (validated, not loaded).
        staged_at / expires_at: monotonic seconds.
        ttl_s: the timeout it was staged with (seconds).
    """

    txn: str
    version: str
    tensors: Dict[str, object]
    staged_at: float
    expires_at: float
    ttl_s: float

    def expires_in(self, now: Optional[float] = None) -> float:
        return self.expires_at - (time.monotonic() if now is None else now)

    def info(self) -> dict:
        """``{"txn", "version", "expires_in_s"}`` (:class:`sglang_specopd.wire.rollout.StagedInfo`)."""
        return {"txn": self.txn, "version": self.version, "expires_in_s": round(max(0.0, self.expires_in()), 3)}


_STATE: Dict[str, object] = {"staged": None, "ended": {}, "last_commit": None}
_ENDED_KEEP = 64  # how many ended transactions are remembered (for the reason in a 409)


def current(now: Optional[float] = None) -> Optional[Staged]:
    """The staged transaction, after dropping it if its deadline passed (recorded as ``expired``)."""
    staged = _STATE["staged"]
    if staged is not None and staged.expires_in(now) <= 0:
        end(staged.txn, "expired")
    return _STATE["staged"]


def put(staged: Staged) -> bool:
    """Stage ``staged`` (replacing a copy of the same txn: returns True then). Raises :class:`TxnConflict` when
    another transaction is staged."""
    old = current()
    if old is not None and old.txn != staged.txn:
        raise TxnConflict(conflict_reason(old, staged.txn))
    _STATE["staged"] = staged
    _STATE["ended"].pop(staged.txn, None)
    return old is not None


def conflict_reason(staged: Staged, txn: Optional[str]) -> str:
    who = f"transaction {txn!r}" if txn else "a one-phase swap"
    return (f"conflict: transaction {staged.txn!r} (version {staged.version!r}) is staged on this worker for "
            f"{staged.expires_in():.1f} s more; {who} cannot proceed until it is committed, aborted or expired")


def check_free() -> None:
    """Raise :class:`TxnConflict` when a transaction is staged (a one-phase swap must wait for it)."""
    staged = current()
    if staged is not None:
        raise TxnConflict(conflict_reason(staged, None))


def take(txn: str) -> Staged:
    """The staged transaction ``txn``, no longer staged (the caller commits it). Raises :class:`TxnConflict` with
    why it is not there: another transaction staged, or ``txn`` expired / aborted / unknown."""
    staged = current()
    if staged is None or staged.txn != txn:
        raise TxnConflict(missing_reason(txn, staged))
    _STATE["staged"] = None
    return staged


def missing_reason(txn: str, staged: Optional[Staged]) -> str:
    ended = _STATE["ended"].get(txn)
    why = f"it was {ended}" if ended else "it was never staged here (or the worker restarted)"
    other = f"; transaction {staged.txn!r} is staged instead" if staged is not None else ""
    return f"conflict: transaction {txn!r} is not staged on this worker: {why}{other}"


def end(txn: str, how: str) -> bool:
    """Drop ``txn``'s staged copy if it is the staged one and record ``how`` it ended (``aborted``, ``expired``,
    ``committed``); True if a staged copy was dropped."""
    staged = _STATE["staged"]
    dropped = staged is not None and staged.txn == txn
    if dropped:
        _STATE["staged"] = None
    ended = _STATE["ended"]
    ended.pop(txn, None)
    ended[txn] = how
    while len(ended) > _ENDED_KEEP:
        ended.pop(next(iter(ended)))
    return dropped


def record_commit(txn: str, reply: dict) -> None:
    """Remember the last committed transaction's reply (a retried commit gets it again, ``already_committed``)."""
    end(txn, "committed")
    _STATE["last_commit"] = (txn, dict(reply))


def last_commit(txn: str) -> Optional[dict]:
    """The reply of ``txn``'s commit if it is the last committed transaction, else None."""
    last = _STATE["last_commit"]
    return dict(last[1]) if last is not None and last[0] == txn else None


def clear_last_commit() -> None:
    """A drafter was installed outside a transaction (a one-phase swap): no retried commit may report success."""
    _STATE["last_commit"] = None


def reset() -> None:
    """Forget everything (tests)."""
    _STATE.update(staged=None, ended={}, last_commit=None)
