"""Pushing a trained drafter into a fleet: one :class:`~specopd_trainer.fleet.rollout.FleetRollout` transaction
(stage on every worker, then commit on all or abort on all), never a swap per worker.

:class:`FleetPusher` is the ``push(drafter, version)`` of ``specopd adapt`` and ``specopd train`` against a fleet:

* every stage succeeded: committed; a worker that did not verify serving the new version afterwards (down during
  the commit, its staged copy expired) is reconciled at once (:meth:`FleetRollout.reconcile`: commits its staged
  copy, or stages and commits again); one still missing is listed in :attr:`FleetPusher.missed` and reconciled again
  before the next push. The push counts as done: the fleet's committed version is the new one.
* a stage failed (a worker refused the drafter, another trainer's transaction holds the fleet, a worker down):
  every worker aborted and kept its version; :class:`FleetPushError` with each refusing worker's reason.

Verification reads each worker's ``GET /specopd/drafter`` only: no probe ``/generate``, which a worker with a
traffic spool would record as served traffic (the adapter would then train on its own probes).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from specopd_trainer.client.http import ServerRequestError
from specopd_trainer.fleet.rollout import FleetRollout, RolloutReport
from specopd_trainer.fleet.worker import DrafterUpdate


class FleetPushError(ServerRequestError):
    """A fleet push was aborted on every worker (nothing changed anywhere); ``report`` is the transaction's."""

    def __init__(self, report: RolloutReport):
        refused = report.refused
        statuses = [w.stage.status for w in report.workers if w.stage is not None and w.stage.status]
        super().__init__(409 if 409 in statuses else (statuses[0] if statuses else 503),
                         f"rollout of drafter version {report.version!r} aborted on every worker (each keeps its "
                         "drafter): " + "; ".join(f"{url}: {reason[:300]}" for url, reason in refused))
        self.report = report

    @property
    def unreachable(self) -> bool:
        """Every failed stage failed because its worker could not be reached (no HTTP answer: connection refused,
        reset, timeout; a worker down or restarting), none because a worker answered with a refusal (4xx, 409:
        another transaction holds the fleet) or an error (5xx, e.g. 503: the drafter does not fit): the same push
        can succeed once the worker is back."""
        failed = [w.stage for w in self.report.workers if w.stage is not None and not w.stage.ok]
        return bool(failed) and all(s.status is None for s in failed)


class FleetPusher:
    """``push(drafter, version)`` into the workers ``urls`` as one transaction (see the module docstring).

    Args:
        urls: every worker of the fleet. admin_api_key / api_key: the workers' keys.
        ttl_s: how long a staged copy lives on a worker that never sees the commit (seconds).
        say: where warnings go (a worker still missing the version after the reconcile).
        rollout: a ready :class:`FleetRollout` (tests: fake workers); default one over ``urls``.
    """

    def __init__(self, urls: Sequence[str], *, admin_api_key: str, api_key: Optional[str] = None,
                 ttl_s: float = 120.0, say: Callable[[str], None] = lambda msg: None,
                 rollout: Optional[FleetRollout] = None):
        self.rollout = rollout or FleetRollout(urls, admin_api_key=admin_api_key, api_key=api_key, ttl_s=ttl_s,
                                               txn_prefix="push")
        self.say = say
        self.missed: List[str] = []
        self.reports: List[RolloutReport] = []

    def close(self) -> None:
        self.rollout.close()

    def push_update(self, update: DrafterUpdate) -> RolloutReport:
        """Roll ``update`` out; returns the committed transaction's report. Raises :class:`FleetPushError` when it
        was aborted."""
        if self.missed and self.rollout.committed_version is not None:  # bring the laggards along first
            self._reconcile(self.missed)
        report = self.rollout.rollout(update)
        self.reports = (self.reports + [report])[-8:]
        if not report.committed:
            raise FleetPushError(report)
        self.missed = self._reconcile(report.missed) if report.missed else []
        return report

    def __call__(self, drafter, version: str) -> RolloutReport:
        """Push a trainer drafter (``checkpoint_config()`` / ``checkpoint_tensors()``) under ``version``."""
        return self.push_update(DrafterUpdate.from_checkpoint(drafter.checkpoint_config(),
                                                              drafter.checkpoint_tensors(), version))

    def _reconcile(self, urls: Sequence[str]) -> List[str]:
        version = self.rollout.committed_version
        outcomes = self.rollout.reconcile(list(urls))
        # serving, not verify.ok: after a refused re-stage, verify is the worker's plain info (ok, old version)
        still = [o.url for o in outcomes if o.verify is None or not o.verify.ok or o.serving != version]
        if still:
            self.say(f"warning: drafter version {version!r} committed, but "
                     f"{', '.join(still)} do(es) not serve it yet (reconciled again before the next push)")
        return still
