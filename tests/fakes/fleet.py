"""Fake fleet workers (:class:`FakeWorker`): a worker's rollout transaction state in memory (serving version, one
staged transaction, the last commit); it can refuse, conflict or be down. Used by the FleetRollout, fleet push and
fleet adapter tests."""

from __future__ import annotations

from typing import Dict, Optional

from specopd_trainer.fleet.worker import Step, WorkerAdmin


DOWN = Step(False, error="GET/POST failed after 3 attempts: connection refused")


class FakeWorker(WorkerAdmin):
    """A worker's rollout state in memory; ``serving`` (verification) is WorkerAdmin's own."""

    def __init__(self, url: str, fleet: Dict[str, "FakeWorker"]):
        self.url, self.version, self.staged, self.last_commit = url, "initial", None, None
        self.down = self.down_at_commit = False
        self.refuse: Optional[str] = None
        self.probe_seen: Optional[list] = None  # what a probe response reports (default: the serving version)
        self.calls = []
        fleet[url] = self

    def close(self) -> None:
        pass

    def _log(self, name: str, txn: str = "") -> bool:
        self.calls.append((name, txn))
        return self.down

    def stage(self, txn, update, ttl_s):
        if self._log("stage", txn):
            return DOWN
        if self.refuse:
            return Step(False, error=self.refuse, status=400)
        if self.staged and self.staged[0] != txn:
            return Step(False, error=f"conflict: transaction {self.staged[0]!r} is staged", status=409)
        self.staged = (txn, update.version)
        return Step(True, reply={"txn": txn, "version": update.version})

    def commit(self, txn):
        if self._log("commit", txn) or self.down_at_commit:
            return DOWN
        if self.staged and self.staged[0] == txn:
            self.version, self.staged, self.last_commit = self.staged[1], None, txn
            return Step(True, reply={"txn": txn, "version": self.version})
        if self.last_commit == txn:
            return Step(True, reply={"txn": txn, "version": self.version, "already_committed": True})
        return Step(False, error=f"conflict: transaction {txn!r} is not staged", status=409)

    def abort(self, txn):
        if self._log("abort", txn):
            return DOWN
        dropped = bool(self.staged and self.staged[0] == txn)
        if dropped:
            self.staged = None
        return Step(True, reply={"txn": txn, "aborted": dropped, "version": self.version})

    def info(self):
        if self.down:
            return DOWN
        staged = {"txn": self.staged[0], "version": self.staged[1]} if self.staged else None
        return Step(True, reply={"version": self.version, "staged": staged})

    def probe_versions(self, input_ids, max_new_tokens):
        return Step(True, reply={"versions": self.probe_seen if self.probe_seen is not None else [self.version]})
