"""Roll a new drafter out to every SPECOPD worker of a fleet as one transaction (two-phase: stage, then commit).

:meth:`FleetRollout.rollout`:

1. stage the update under one fresh transaction id on the worker with the lowest URL (the fleet's lock: of two
   trainers rolling out at once, the first to stage there wins, the other gets 409 and stages nowhere), then on
   every other worker in parallel: each validates it exactly as a one-phase swap and holds it beside its serving
   drafter (``POST /specopd/drafter/stage``);
2. if ANY stage fails (refused drafter, another transaction staged there: 409, worker down), abort on every worker:
   nothing changes anywhere, the report says which worker refused and why;
3. otherwise commit on every worker (the decision is taken: the update is now the fleet's committed version);
4. verify each worker: ``GET /specopd/drafter`` reports the new version and, with ``probe_input_ids``, a
   ``/generate`` response started after the commit was drafted by the new version only (``meta_info
   ["specopd_drafter_versions"]``). A worker whose commit failed (down, or its staged copy expired) is reported
   in :attr:`RolloutReport.missed`; :meth:`FleetRollout.reconcile` brings it (or a worker that joins later) to
   the committed version.

:meth:`FleetRollout.rollback` is the same transaction with the previously committed update. The trainer keeps the
updates it committed (the last :data:`HISTORY` ones) to roll back and reconcile; ``initial`` registers the weights
the fleet serves before the first rollout so that they can be rolled back to. See ``docs/fleet_rollout.md``.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from specopd_trainer.fleet.worker import DrafterUpdate, Step, WorkerAdmin

HISTORY = 8  # committed updates kept (rollback, reconcile)


@dataclass(frozen=True)
class WorkerOutcome:
    """What happened on one worker.

    Attributes:
        url: the worker.
        stage / commit / abort: the steps run (None: not run; e.g. no stage after the lock worker refused).
        verify: ``GET /specopd/drafter`` (+ probe) after the transaction; ``verify.reply["version"]`` is what the
            worker serves (None when it could not be read).
    """

    url: str
    stage: Optional[Step] = None
    commit: Optional[Step] = None
    abort: Optional[Step] = None
    verify: Optional[Step] = None

    @property
    def serving(self) -> Optional[str]:
        """The version the worker reported serving after the transaction (None: unknown)."""
        return (self.verify.reply or {}).get("version") if self.verify is not None else None

    @property
    def error(self) -> Optional[str]:
        """The first failure's reason (stage, commit, then verify), or None."""
        for step in (self.stage, self.commit, self.verify):
            if step is not None and not step.ok:
                return step.error
        return None


@dataclass(frozen=True)
class RolloutReport:
    """A transaction's outcome: ``committed`` (every stage succeeded and the commit was sent to every worker),
    ``version`` the update's, one :class:`WorkerOutcome` per worker in fleet order."""

    txn: str
    version: str
    committed: bool
    workers: Tuple[WorkerOutcome, ...]

    @property
    def missed(self) -> Tuple[str, ...]:
        """Workers not verified serving ``version`` after a commit (reconcile them); () when not committed."""
        if not self.committed:
            return ()
        return tuple(w.url for w in self.workers if w.verify is None or not w.verify.ok)

    @property
    def ok(self) -> bool:
        """Committed and every worker verified serving the new version."""
        return self.committed and not self.missed

    @property
    def refused(self) -> Tuple[Tuple[str, str], ...]:
        """``(url, reason)`` of every worker whose stage failed (why the transaction was aborted)."""
        return tuple((w.url, w.stage.error or "") for w in self.workers if w.stage is not None and not w.stage.ok)


class FleetRollout:
    """Transactions over the workers ``urls`` (see the module docstring).

    Args:
        urls: the workers' base URLs (SPECOPD servers started with the same ``--admin-api-key``).
        admin_api_key / api_key: the workers' admin key and, when set, their normal API key.
        ttl_s: how long a staged copy lives on a worker if it is neither committed nor aborted (seconds).
        probe_input_ids / probe_tokens: when given, each worker is also verified by a greedy ``/generate`` of
            ``probe_tokens`` new tokens (>= 2, so that at least one verify step runs) after the commit.
        initial: the update the fleet serves before the first rollout (what :meth:`rollback` returns to then).
        timeout / retries / backoff_s: per request (:class:`~specopd_trainer.fleet.worker.WorkerAdmin`).
        txn_prefix: transaction ids are ``f"{txn_prefix}-{16 hex digits}"``.
        worker_factory: ``url -> WorkerAdmin`` (tests: fake workers); default a real one with the settings above.
    """

    def __init__(self, urls: Sequence[str], *, admin_api_key: str, api_key: Optional[str] = None,
                 ttl_s: float = 120.0, probe_input_ids: Optional[Sequence[int]] = None, probe_tokens: int = 4,
                 initial: Optional[DrafterUpdate] = None, timeout: float = 300.0, retries: int = 2,
                 backoff_s: float = 0.5, txn_prefix: str = "rollout",
                 worker_factory: Optional[Callable[[str], WorkerAdmin]] = None):
        if not urls:
            raise ValueError("FleetRollout needs at least one worker URL")
        if probe_input_ids is not None and probe_tokens < 2:
            raise ValueError(f"probe_tokens must be >= 2 (a verify step must run), got {probe_tokens}")
        self.ttl_s, self.txn_prefix = float(ttl_s), txn_prefix
        self.probe = (list(probe_input_ids), int(probe_tokens)) if probe_input_ids is not None else None
        self._make: Callable[[str], WorkerAdmin] = worker_factory or (lambda url: WorkerAdmin(
            url, admin_api_key=admin_api_key, api_key=api_key, timeout=timeout, retries=retries, backoff_s=backoff_s))
        self.workers: Dict[str, WorkerAdmin] = {}
        for url in urls:
            self._worker(url)
        self.history: List[Tuple[str, DrafterUpdate]] = [("", initial)] if initial is not None else []

    def _worker(self, url: str) -> WorkerAdmin:
        url = url.rstrip("/")
        if url not in self.workers:
            self.workers[url] = self._make(url)
        return self.workers[url]

    def close(self) -> None:
        for w in self.workers.values():
            w.close()

    def __enter__(self) -> "FleetRollout":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def committed_version(self) -> Optional[str]:
        """The version of the last committed update (None before the first one, without ``initial``)."""
        return self.history[-1][1].version if self.history else None

    def _each(self, fn, urls: Sequence[str]) -> list:
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(urls)))) as pool:
            return list(pool.map(lambda u: fn(self._worker(u)), urls))

    def _new_txn(self) -> str:
        return f"{self.txn_prefix}-{uuid.uuid4().hex[:16]}"

    def _transaction(self, urls: Sequence[str], update: DrafterUpdate) -> RolloutReport:
        txn = self._new_txn()
        # The lowest URL first, alone: it is the fleet's lock. Of two trainers rolling out at once, the one that
        # stages there first wins; the other gets 409 there and has staged nowhere else (parallel stages
        # everywhere could leave each trainer holding some workers, and both abort).
        lock = min(urls)
        first = self._worker(lock).stage(txn, update, self.ttl_s)
        rest = [u for u in urls if u != lock]
        others = self._each(lambda w: w.stage(txn, update, self.ttl_s), rest) if first.ok else [None] * len(rest)
        by_url = {lock: first, **dict(zip(rest, others))}
        stages = [by_url[u] for u in urls]
        if not all(s is not None and s.ok for s in stages):
            aborts = self._each(lambda w: w.abort(txn), urls)
            infos = self._each(lambda w: w.info(), urls)
            return RolloutReport(txn, update.version, False, tuple(
                WorkerOutcome(u, stage=s, abort=a, verify=i) for u, s, a, i in zip(urls, stages, aborts, infos)))
        commits = self._each(lambda w: w.commit(txn), urls)
        self._remember(txn, update)
        verifies = self._each(lambda w: w.serving(update.version, self.probe), urls)
        return RolloutReport(txn, update.version, True, tuple(
            WorkerOutcome(u, stage=s, commit=c, verify=v) for u, s, c, v in zip(urls, stages, commits, verifies)))

    def _remember(self, txn: str, update: DrafterUpdate) -> None:
        self.history.append((txn, update))
        del self.history[:-HISTORY]

    def rollout(self, update: DrafterUpdate) -> RolloutReport:
        """Stage ``update`` on every worker, then commit on all or abort on all (see the module docstring)."""
        return self._transaction(list(self.workers), update)

    def rollback(self) -> RolloutReport:
        """Roll the fleet back to the update committed before the current one (the same transaction).

        Raises:
            ValueError: fewer than two committed updates are known (pass ``initial`` to roll back the first)."""
        if len(self.history) < 2:
            raise ValueError("nothing to roll back to: no earlier committed update is known (pass initial=...)")
        return self._transaction(list(self.workers), self.history[-2][1])

    def _update_for(self, version: str) -> Tuple[str, DrafterUpdate]:
        for txn, update in reversed(self.history):
            if update.version == version:
                return txn, update
        raise ValueError(f"no committed update of version {version!r} is known (known: "
                         f"{[u.version for _, u in self.history]})")

    def reconcile(self, workers: Optional[Sequence[str]] = None,
                  version: Optional[str] = None) -> Tuple[WorkerOutcome, ...]:
        """Bring ``workers`` (default: the fleet; new URLs join it) to ``version`` (default: the committed one).

        A worker already serving it is only verified. Otherwise: if it still holds the commit's staged copy (it
        missed the commit), that transaction is committed; else the update is staged and committed on it alone
        under a new transaction id. Returns one :class:`WorkerOutcome` per worker (``verify.ok``: it serves
        ``version`` now). Raises ValueError when no committed update of ``version`` is known."""
        version = version or self.committed_version
        if version is None:
            raise ValueError("nothing committed yet: no version to reconcile to")
        txn, update = self._update_for(version)
        return tuple(self._each(lambda w: self._reconcile_one(w, txn, update), list(workers or self.workers)))

    def _reconcile_one(self, worker: WorkerAdmin, txn: str, update: DrafterUpdate) -> WorkerOutcome:
        info = worker.info()
        if info.ok and info.reply.get("version") == update.version:
            return WorkerOutcome(worker.url, verify=worker.serving(update.version, self.probe))
        staged = info.reply.get("staged") if info.ok else None
        stage = commit = None
        if txn and staged and staged.get("txn") == txn:
            commit = worker.commit(txn)
        if commit is None or not commit.ok:
            new_txn = self._new_txn()
            stage = worker.stage(new_txn, update, self.ttl_s)
            if stage.ok:
                commit = worker.commit(new_txn)
            else:
                return WorkerOutcome(worker.url, stage=stage, abort=worker.abort(new_txn), verify=worker.info())
        return WorkerOutcome(worker.url, stage=stage, commit=commit, verify=worker.serving(update.version, self.probe))
