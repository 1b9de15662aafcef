"""Two-phase drafter swap (scheduler side): the ``stage_drafter`` / ``commit_drafter`` / ``abort_drafter`` /
``expire_drafter`` ops behind ``POST /specopd/drafter/stage|commit|abort`` (:mod:`.rollout_routes`).

* stage: the body is validated exactly as a one-phase swap's (:func:`.swap.check_swap_request`: provenance,
  spec, names, shapes, dtypes, finite values, checksum, version), then its tensors are copied to the draft model's
  device and held beside the serving drafter (:class:`.txn.Staged`, not serving), under the transaction
  id, until ``ttl_s`` seconds have passed. A different transaction already staged: 409 before anything is read.
  Memory: one extra copy of the drafter's weights while staged (validation itself holds the CPU copy, as a swap).
* commit: the staged tensors become the serving drafter between batches (ops run in the scheduler's event loop,
  never during a forward) through the same :func:`.swap.install` as a one-phase swap (``load_weights``,
  rebuild of derived state, rollback on a failed load, version bump, radix cache flush when idle). A retried
  commit of the transaction committed last answers its reply again with ``already_committed: true``.
* abort: drops the staged copy if it is this transaction's (never another's); nothing else changes.
* expire: sent by the HTTP side's timer at the deadline; drops the staged copy if due, and says how long a still
  staged one has left (the deadline is checked at every op too, :func:`.txn.current`).

Replies: JSON of :mod:`sglang_specopd.wire.rollout`'s models. Errors: ValueError -> 400, TxnConflict -> 409
(:func:`~sglang_specopd.server.control.handle_control`), 503 when the staged copy does not fit in the device's memory.
"""

from __future__ import annotations

import json
import time

from sglang_specopd.server.drafter import txn as drafter_txn
from sglang_specopd.server.drafter import swap as hot_swap
from sglang_specopd.server.control import op
from sglang_specopd.server.drafter.txn import Staged, TxnConflict


def _device_of(worker):
    for p in worker.draft_model.parameters():
        return p.device
    return "cpu"


def _txn_of(payload: bytes) -> str:
    from sglang_specopd.wire.rollout import check_txn_id

    return check_txn_id(json.loads(payload).get("txn"))


@op("stage_drafter")
def stage_drafter_op(scheduler, payload: bytes):
    """Validate and stage a drafter (payload: :func:`sglang_specopd.wire.rollout.stage_op_payload`); reply a
    :class:`~sglang_specopd.wire.rollout.StageReply`."""
    import torch

    from sglang_specopd.wire.rollout import split_stage_payload

    params, body = split_stage_payload(payload)
    staged = drafter_txn.current()
    if staged is not None and staged.txn != params.txn:  # refuse before reading a byte of the drafter
        raise TxnConflict(drafter_txn.conflict_reason(staged, params.txn))
    worker, tensors, version = hot_swap.checked_drafter(scheduler, body)
    device = _device_of(worker)
    try:
        tensors = {n: t.to(device) for n, t in tensors.items()}
    except torch.OutOfMemoryError as exc:
        return 503, f"cannot stage: the drafter copy does not fit in {device} memory ({exc})", b""
    now = time.monotonic()
    replaced = drafter_txn.put(Staged(params.txn, version, tensors, now, now + params.ttl_s, params.ttl_s))
    reply = {"txn": params.txn, "version": version, "serving_version": hot_swap.current_version(),
             "ttl_s": params.ttl_s, "expires_in_s": params.ttl_s, "replaced": replaced}
    return 200, "ok", json.dumps(reply).encode()


@op("commit_drafter")
def commit_drafter_op(scheduler, payload: bytes):
    """Make the staged transaction ``{"txn": ID}`` the serving drafter; reply a
    :class:`~sglang_specopd.wire.rollout.CommitReply`. 409 when it is not staged."""
    txn = _txn_of(payload)
    worker = hot_swap.serving_worker(scheduler)
    staged = drafter_txn.current()
    done = drafter_txn.last_commit(txn)
    if done is not None and (staged is None or staged.txn != txn):
        return 200, "ok", json.dumps({**done, "already_committed": True}).encode()
    staged = drafter_txn.take(txn)
    try:
        reply = hot_swap.install(scheduler, worker, staged.tensors, staged.version)
    except BaseException:
        drafter_txn.end(txn, "refused at commit (loading failed; the previous drafter was restored)")
        raise
    reply = {"txn": txn, **reply, "already_committed": False}
    drafter_txn.record_commit(txn, reply)
    return 200, "ok", json.dumps(reply).encode()


@op("abort_drafter")
def abort_drafter_op(scheduler, payload: bytes):
    """Drop the staged copy of ``{"txn": ID}`` if it is staged; reply an
    :class:`~sglang_specopd.wire.rollout.AbortReply` (always 200)."""
    txn = _txn_of(payload)
    drafter_txn.current()
    aborted = drafter_txn.end(txn, "aborted")
    other = drafter_txn.current()
    reply = {"txn": txn, "aborted": aborted, "version": hot_swap.current_version(),
             "staged": other.info() if other is not None else None}
    return 200, "ok", json.dumps(reply).encode()


@op("expire_drafter")
def expire_drafter_op(scheduler, payload: bytes):
    """Drop ``{"txn": ID}``'s staged copy if its deadline passed; reply ``{"txn", "expires_in_s"}`` (seconds left
    while it is still staged, else null)."""
    txn = _txn_of(payload)
    staged = drafter_txn.current()
    left = staged.expires_in() if staged is not None and staged.txn == txn else None
    return 200, "ok", json.dumps({"txn": txn, "expires_in_s": left}).encode()
