"""Where ``specopd train`` and ``specopd adapt`` find their server(s): one server (``--server``), or a fleet of
workers (``--workers URL,URL [--router URL]`` or ``--fleet-run-dir DIR``, the run directory of ``specopd fleet
start``), and the fleet's session (:class:`FleetSession`, the fleet's counterpart of
:class:`~sglang_specopd.app.train.session._Session`).

Against a fleet the trainer's client is a :class:`specopd_trainer.fleet.client.FleetClient`: generation through the
router (when there is one), ``score_trees`` spread over the workers with affinity by reference, every worker's
spool read with its own cursor, pushes as one :class:`~specopd_trainer.fleet.rollout.FleetRollout` transaction
(:class:`specopd_trainer.fleet.push.FleetPusher`). Before anything else every worker is asked what it serves: a
fleet whose workers serve different targets or drafters is refused (exit 1), as is one with a worker down.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from sglang_specopd.app.train.options import ADMIN_KEY_ENV, _TrainFail
from sglang_specopd.app.train.session import _Session


@dataclass(frozen=True)
class Endpoints:
    """One server (``server``) or a fleet (``workers``, optional ``router``)."""

    server: Optional[str] = None
    workers: Tuple[str, ...] = ()
    router: Optional[str] = None

    @property
    def is_fleet(self) -> bool:
        return bool(self.workers)


def _url(value: str, flag: str) -> str:
    value = value.strip().rstrip("/")
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise _TrainFail(f"bad option {flag}: {value!r} is not an http(s) URL")
    return value


def resolve_endpoints(server: Optional[str], workers: Optional[str], router: Optional[str],
                      fleet_run_dir: Optional[Path], api_key: Optional[str] = None,
                      list_workers: Optional[Callable[[str, Optional[str]], List[str]]] = None) -> Endpoints:
    """The servers the options name. Exactly one of ``--server``, ``--workers``, ``--fleet-run-dir``, or
    ``--router`` alone (its workers are the ones the router lists: ``GET /workers``, ``list_workers(url, api_key)``,
    default :func:`~sglang_specopd.app.fleet.router.router_workers`); ``--router`` also goes with ``--workers`` (with
    ``--fleet-run-dir`` it replaces the state file's router). Raises _TrainFail (exit 2) otherwise, or (exit 1) for
    a fleet run directory without a ready fleet or a router that lists no worker."""
    given = [flag for flag, v in (("--server", server), ("--workers", workers), ("--fleet-run-dir", fleet_run_dir))
             if v]
    if not given and router:
        from sglang_specopd.app.fleet.router import router_workers

        url = _url(router, "--router")
        try:
            urls = (list_workers or router_workers)(url, api_key)
        except ValueError as exc:
            raise _TrainFail(f"cannot find the fleet's workers through --router: {exc}", 1) from None
        return Endpoints(workers=tuple(_url(u, "the router's worker list") for u in urls), router=url)
    if len(given) != 1:
        raise _TrainFail("name the server(s) once: --server URL (one server), --router URL (a fleet, its workers as "
                         "the router lists them), --workers URL,URL [--router URL] or --fleet-run-dir DIR (a fleet "
                         "started by `specopd fleet start`)" + (f"; got {' and '.join(given)}" if given else ""))
    if server:
        if router:
            raise _TrainFail("--server is one server; a fleet's router goes alone (--router URL: its workers as "
                             "it lists them) or with --workers / --fleet-run-dir")
        return Endpoints(server=_url(server, "--server"))
    if workers:
        urls = tuple(dict.fromkeys(_url(u, "--workers") for u in workers.split(",") if u.strip()))
        if not urls:
            raise _TrainFail("bad option --workers: no URL")
        return Endpoints(workers=urls, router=_url(router, "--router") if router else None)
    from sglang_specopd.app.fleet.plan import FleetError
    from sglang_specopd.app.fleet.state import read_state

    try:
        state = read_state(fleet_run_dir)
    except FleetError as exc:
        raise _TrainFail(str(exc), 1) from None
    if state is None:
        raise _TrainFail(f"no fleet in {fleet_run_dir} (no fleet.json): start one with `specopd fleet start`", 1)
    if state.status != "ready" or not state.worker_urls:
        raise _TrainFail(f"the fleet in {fleet_run_dir} is {state.status}, not ready (`specopd fleet status`)", 1)
    return Endpoints(workers=tuple(state.worker_urls),
                     router=_url(router, "--router") if router else state.router_url)


def open_session(ends: Endpoints, api_key: Optional[str], admin_key: Optional[str], init: Optional[Path],
                 target: Optional[str], *, need_push: bool, say: Callable[[str], None]) -> _Session:
    """The session for ``ends``: :class:`_Session` for one server, :class:`FleetSession` for a fleet. (Callers
    import this function when they run, so tests replace it, never the :class:`_Session` class that
    :class:`FleetSession` subclasses.)"""
    if ends.is_fleet:
        return FleetSession(ends, api_key, admin_key, init, target, need_push=need_push, say=say)
    return _Session(ends.server, api_key, admin_key, init, target, need_push=need_push, say=say)


class FleetSession(_Session):
    """A :class:`_Session` over a fleet: ``client`` is a FleetClient, ``push`` a FleetRollout transaction, ``info``
    the first worker's drafter info once every worker was checked to serve the same target and drafter."""

    def __init__(self, ends: Endpoints, api_key: Optional[str], admin_key: Optional[str], init: Optional[Path],
                 target: Optional[str], *, need_push: bool, say: Callable[[str], None]):
        from specopd_trainer.client.http import ServerRequestError, ServerUnavailableError
        from specopd_trainer.fleet.check import FleetMismatchError
        from specopd_trainer.fleet.client import FleetClient, rank_share
        from specopd_trainer.loops.common import dist_info

        self.workers, self.router = list(ends.workers), ends.router
        self.url = self.workers[0]  # asked for its model_info and (admin) its start-up drafter's path
        self.where = f"fleet of {len(self.workers)} worker(s) " + (f"behind {self.router}" if self.router else
                                                                   f"({', '.join(self.workers)})")
        self.api_key, self.admin_key = api_key, admin_key or None
        rank, world = dist_info()  # under torchrun the ranks split the workers (each falls back on the others)
        self.client = FleetClient(self.workers, router=self.router, api_key=api_key, admin_api_key=self.admin_key,
                                  preferred=rank_share(self.workers, rank, world) if world > 1 else None)
        try:
            self.identity = self.client.check()
            self.info = self.client.drafter_info()
            try:
                self.model_info = self.client.workers[self.url]._request("GET", "/model_info").json()
            except (ServerRequestError, ValueError):  # no route, or not JSON: the target comes from --target
                self.model_info = {}
        except FleetMismatchError as exc:
            raise _TrainFail(str(exc), 1) from None
        except ServerUnavailableError as exc:
            raise _TrainFail(f"cannot reach every worker of the fleet: {exc}", 1) from None
        except ServerRequestError as exc:
            hint = {404: " (is every URL a sglang-specopd worker? the router's own URL goes in --router)",
                    401: " (pass the workers' --api-key as --api-key or SPECOPD_API_KEY)"}.get(exc.status, "")
            raise _TrainFail(f"GET /specopd/drafter on the fleet's workers failed: {exc}{hint}", 1) from None
        if self.identity.version is None:
            say(f"note: the workers serve different drafter versions ({dict(self.identity.versions)}); the first "
                "push brings them all to one")
        self.target = self._resolve_target(target)
        self.init = self._resolve_init(init, say)
        self.push_enabled = self.admin_key is not None
        if need_push and not self.push_enabled:
            raise _TrainFail(f"this method pushes the drafter into the fleet: pass --admin-key (or {ADMIN_KEY_ENV}) "
                             "with the workers' --admin-api-key")
        self._pusher, self.say = None, say
        if self.push_enabled:
            for url in self.workers:
                self._check_push_at(url)
            from specopd_trainer.fleet.push import FleetPusher

            self._pusher = FleetPusher(self.workers, admin_api_key=self.admin_key, api_key=api_key, say=say)
        else:
            say(f"no --admin-key ({ADMIN_KEY_ENV}): the trained drafter will not be pushed into the fleet")

    def push(self, drafter, version: str) -> None:
        """One FleetRollout transaction to ``version`` on every worker; raises FleetPushError (a
        ServerRequestError) when it was aborted (every worker keeps its drafter)."""
        self._pusher(drafter, version)

    KEPT = "every worker kept its drafter"

    def _defer_push(self, exc: Exception, version: str) -> bool:
        """A push aborted only because a worker was down (:attr:`FleetPushError.unreachable`: every worker keeps
        its drafter) is deferred, not fatal: training goes on, the next push (or :meth:`finish_pushes`) tries
        again. A refusal (4xx, 409: another trainer's transaction, a 5xx answer) ends the run as on one server."""
        from specopd_trainer.fleet.push import FleetPushError

        if not (isinstance(exc, FleetPushError) and exc.unreachable):
            return False
        self.deferred = version
        self.say(f"warning: push of {version} deferred, a worker is down ({exc}); training goes on, the next push "
                 "tries again")
        return True

    def finish_pushes(self, drafter, versions: List[str], *, retry_s: float = 300.0, gap_s: float = 10.0,
                      sleep: Callable[[float], None] = time.sleep,
                      clock: Callable[[], float] = time.monotonic) -> None:
        """End of a run: when its last push was deferred (a worker down), push ``drafter`` under that version
        again every ``gap_s`` seconds for up to ``retry_s`` seconds (a restarted worker comes back). Raises
        :class:`_TrainFail` (exit 1) when the fleet still cannot take it: every worker keeps its drafter, the
        training state is checkpointed, and rerunning the same command pushes the final drafter."""
        from specopd_trainer.fleet.push import FleetPushError

        if self.deferred is None:
            return
        version, deadline = self.deferred, clock() + retry_s
        while True:
            self.say(f"the last push ({version}) was deferred: trying again in {gap_s:.0f} s")
            sleep(gap_s)
            try:
                self.push(drafter, version)
            except FleetPushError as exc:
                if exc.unreachable and clock() < deadline:
                    continue
                raise _TrainFail(f"the last push ({version}) did not reach every worker within {retry_s:.0f} s "
                                 f"({exc}); every worker keeps its drafter and the training state is checkpointed: "
                                 "rerun the same command once the workers are up to push it", 1) from None
            self.deferred = None
            versions.append(version)
            return

    def serving_version(self) -> str:
        """The drafter version every worker serves, ``mixed:<v1>|<v2>...`` when they differ, or ``unknown (...)``
        when a worker does not answer (the run's summary must not fail on a worker that went down at the end)."""
        from specopd_trainer.client.http import ServerError

        try:
            versions = sorted({str(v) for v in self.client.drafter_info()["versions"].values()})
        except ServerError as exc:
            return f"unknown ({str(exc)[:200]})"
        return versions[0] if len(versions) == 1 else "mixed:" + "|".join(versions)

    def check_traffic(self) -> None:
        """Every worker's spool readable with the admin key; _TrainFail (exit 1) naming the first that is not."""
        from specopd_trainer.client.http import ServerRequestError

        for url in self.workers:
            try:
                self.client.traffic_page(0, None, 1, worker=url)
            except ServerRequestError as exc:
                raise _TrainFail(f"cannot read the traffic of worker {url} (HTTP {exc.status}: {exc.reason})",
                                 1) from None
