"""The trainer's client for a fleet: N SPECOPD workers (same target, same drafter architecture), optionally behind
sglang-router; a stand-in for :class:`~specopd_trainer.client.http.SpecOPDClient` wherever the trainer uses one.

What goes where (docs/fleet.md, "Training against a fleet"):

* ``generate`` goes through the router when there is one (sglang-router balances; no balancer here). A request
  with ``custom_params`` (a per-step trace, the spool opt-out) goes to a worker directly: sglang-router 0.3.2
  drops ``custom_params`` from ``/generate``, so through the router a Draft-OPD / sequential-OPD rollout would come
  back without its trace and a measurement would be recorded in the spool. Without a router every request goes to
  a worker directly. Direct requests pick their worker by rendezvous hashing of the prompt, with failover.
* ``score_trees`` (the router answers 404 for ``/specopd/*``): the references of one call are split by worker, each
  reference to the first worker of its rendezvous order (:mod:`specopd_trainer.fleet.routing`, key: the
  reference's token ids, so the worker that cached its prefix scores it again) that still has room in this call:
  no worker takes more than ``ceil(references / workers up)`` of one call (bounded load: with 2 references and 2
  workers, both would land on one worker in half of the calls and the call would take as long as on one worker).
  The parts are sent in parallel and the answers put back in request order. A part whose worker drops out is re-split over the next workers of its
  references' orders: no reference is lost, the caller sees one answer.
* traffic: every worker's spool is read with its own cursor (``traffic_page(..., worker=url)``, used by
  :class:`specopd_trainer.adapt.fleet_reader.FleetTrafficReader`; ``traffic`` for Draft-OPD from traffic), and
  ``traffic_features`` goes to the worker whose spool holds the items (by spool id).
* :meth:`check` reads every worker's ``GET /specopd/drafter`` and refuses a fleet whose workers serve different
  targets or drafters (:mod:`specopd_trainer.fleet.check`). Pushes go through
  :class:`specopd_trainer.fleet.push.FleetPusher` (a :class:`~specopd_trainer.fleet.rollout.FleetRollout`
  transaction), never a swap per worker.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence

from specopd_trainer.client.http import ServerRequestError, ServerUnavailableError, SpecOPDClient
from specopd_trainer.fleet.check import FleetIdentity, check_fleet
from specopd_trainer.fleet.routing import (FleetUnavailableError, WorkerHealth, affinity_key, call_with_failover,
                                           rendezvous_order)


class FleetClient:
    """Generation, tree scoring, traffic and drafter info over the workers ``workers`` (see the module docstring).

    Args:
        workers: the workers' base URLs (at least one; duplicates dropped, order kept).
        router: the router's URL (generation without ``custom_params`` goes there), or None.
        api_key / admin_api_key: the workers' (and router's) ``--api-key`` and ``--admin-api-key``.
        timeout / retries / backoff_s / busy_retries: per worker request (:class:`SpecOPDClient`); few retries, so a
            worker that dropped out is left for the next one quickly (``backoff_s * (2**retries - 1)`` s).
        cooldown_s: a worker that failed is tried after the others this long (:class:`WorkerHealth`).
        client_factory: ``url -> client`` (tests: fake workers); default a :class:`SpecOPDClient` as above (the
            router's with SpecOPDClient's default retries).
        preferred: the workers this client tries first (under torchrun: this rank's share of the fleet, so ranks
            split the workers; :func:`rank_share`); references and direct requests go by rendezvous among them, and
            fail over to the other workers only when all of them fail. Default: every worker.

    Raises:
        ValueError: no worker.
    """

    def __init__(self, workers: Sequence[str], *, router: Optional[str] = None, api_key: Optional[str] = None,
                 admin_api_key: Optional[str] = None, timeout: float = 600.0, retries: int = 1,
                 backoff_s: float = 0.5, busy_retries: int = 8, cooldown_s: float = 30.0,
                 client_factory: Optional[Callable[[str], Any]] = None, preferred: Optional[Sequence[str]] = None):
        urls = list(dict.fromkeys(u.rstrip("/") for u in workers))
        if not urls:
            raise ValueError("FleetClient needs at least one worker URL")
        mine = [u.rstrip("/") for u in preferred] if preferred else urls
        if not set(mine) <= set(urls) or not mine:
            raise ValueError(f"preferred workers {list(preferred or [])} are not among the workers {urls}")
        self.preferred = [u for u in urls if u in mine]
        make = client_factory or (lambda url, **kw: SpecOPDClient(
            url, api_key=api_key, admin_api_key=admin_api_key, timeout=timeout, busy_retries=busy_retries, **kw))
        kw = {} if client_factory else {"retries": retries, "backoff_s": backoff_s}
        self.workers: Dict[str, Any] = {u: make(u, **kw) for u in urls}
        self.router = make(router.rstrip("/")) if router else None
        self.url = router.rstrip("/") if router else urls[0]  # for messages
        self.health = WorkerHealth(cooldown_s)
        self._spools: Dict[str, str] = {}  # spool id -> the worker whose spool it is
        self.last_traffic: Optional[SimpleNamespace] = None
        self.counts: Dict[str, Any] = {"generate_router": 0, "generate_direct": 0, "failovers": 0,
                                       "references": {u: 0 for u in urls}}

    @property
    def worker_urls(self) -> List[str]:
        return list(self.workers)

    def close(self) -> None:
        for c in [*self.workers.values(), *([self.router] if self.router is not None else [])]:
            c.close()

    def __enter__(self) -> "FleetClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _failed_over(self, url: str, reason: str) -> None:
        self.counts["failovers"] += 1

    def _order(self, key: bytes) -> List[str]:
        """Rendezvous order among the preferred workers, then among the others (failover only)."""
        rest = [u for u in self.worker_urls if u not in self.preferred]
        return rendezvous_order(key, self.preferred) + (rendezvous_order(key, rest) if rest else [])

    def _on_workers(self, key: bytes, call: Callable[[Any], Any], what: str):
        return call_with_failover(self._order(key), lambda u: call(self.workers[u]),
                                  self.health, what=what, on_failover=self._failed_over)

    # ---- identity ------------------------------------------------------------------------------------------------
    def drafter_infos(self) -> Dict[str, Dict[str, Any]]:
        """Every worker's ``GET /specopd/drafter`` (url -> reply). Raises :class:`ServerUnavailableError` naming
        the workers that did not answer."""
        def one(url: str):
            try:
                return self.workers[url].drafter_info()
            except ServerUnavailableError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=min(8, len(self.workers))) as pool:
            got = dict(zip(self.workers, pool.map(one, self.workers)))
        down = {u: r for u, r in got.items() if isinstance(r, Exception)}
        if down:
            raise ServerUnavailableError("worker(s) not answering GET /specopd/drafter: "
                                         + "; ".join(f"{u}: {str(e)[:200]}" for u, e in down.items()))
        return got

    def check(self) -> FleetIdentity:
        """The fleet's identity; raises :class:`~specopd_trainer.fleet.check.FleetMismatchError` when the workers
        serve different targets (fingerprint, dtype) or drafters (architecture, spec)."""
        return check_fleet(self.drafter_infos())

    def drafter_info(self) -> Dict[str, Any]:
        """The first worker's ``GET /specopd/drafter`` with ``version`` the fleet's (None when the workers differ)
        and ``versions`` (url -> version)."""
        infos = self.drafter_infos()
        versions = {u: i.get("version") for u, i in infos.items()}
        same = set(versions.values())
        return {**next(iter(infos.values())), "version": same.pop() if len(same) == 1 else None,
                "versions": versions}

    # ---- generation and scoring -----------------------------------------------------------------------------------
    def generate(self, input_ids: List[int], *, max_new_tokens: int, temperature: float = 0.0, trace: bool = False,
                 **sampling) -> Dict[str, Any]:
        """``/generate`` through the router, or on a worker directly when ``trace`` or ``custom_params`` is asked
        for, there is no router, or the router does not answer (rendezvous on the prompt, failover). SGLang's JSON
        reply."""
        kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, trace=trace, **sampling)
        if self.router is not None and not trace and "custom_params" not in sampling:
            self.counts["generate_router"] += 1
            try:
                return self.router.generate(input_ids, **kwargs)
            except ServerUnavailableError as exc:  # the router is down: the workers still answer
                self._failed_over(self.url, str(exc))
        self.counts["generate_direct"] += 1
        return self._on_workers(affinity_key(input_ids), lambda c: c.generate(input_ids, **kwargs), "/generate")

    def score_trees(self, req) -> List[Any]:
        """``POST /specopd/score_trees`` split over the workers by reference (see the module docstring); one
        :class:`~specopd_trainer.client.http.ScoredReference` per reference, in request order. Raises
        :class:`FleetUnavailableError` when every worker failed some reference, the workers' 4xx errors as they
        are."""
        keys = [affinity_key(r.input_ids) for r in req.references]
        orders = [self.health.order(self._order(k)) for k in keys]
        out: Dict[int, Any] = {}
        todo, tried = list(range(len(keys))), {i: set() for i in range(len(keys))}
        errors: Dict[str, str] = {}
        while todo:
            parts: Dict[str, List[int]] = {}
            up = [u for u in self.preferred if not self.health.is_down(u) and u not in errors] or self.worker_urls
            cap = -(-len(todo) // len(up))  # bounded load: no worker takes more than its share of one call
            for i in todo:
                left = [u for u in orders[i] if u not in tried[i]]
                if not left:
                    raise FleetUnavailableError(f"score_trees (reference {i})", [(u, errors[u]) for u in orders[i]])
                pick = next((u for u in left if len(parts.get(u, ())) < cap), left[0])
                parts.setdefault(pick, []).append(i)

            def send(item):
                url, idx = item
                sub = req.model_copy(update={"references": [req.references[i] for i in idx]})
                try:
                    return self.workers[url].score_trees(sub)
                except ServerUnavailableError as exc:
                    return exc

            with ThreadPoolExecutor(max_workers=max(1, min(8, len(parts)))) as pool:
                answers = list(pool.map(send, parts.items()))
            todo = []
            for (url, idx), ans in zip(parts.items(), answers):
                if isinstance(ans, ServerUnavailableError):
                    errors[url] = str(ans)
                    self.health.mark_down(url)
                    self._failed_over(url, str(ans))
                    for i in idx:
                        tried[i].add(url)
                    todo += idx
                    continue
                self.health.mark_up(url)
                self.counts["references"][url] += len(idx)
                out.update(zip(idx, ans))
        return [out[i] for i in range(len(keys))]

    def context_features(self, input_ids: List[int], layer_ids: List[int], dtype: str = "float32"):
        """Target context features [P, K*H] for one sequence, from the worker its affinity picks."""
        from sglang_specopd.wire.protocol import ScoreTreesRequest

        req = ScoreTreesRequest(references=[{"input_ids": input_ids}], block_size=2, returns=[],
                                feature_layer_ids=list(layer_ids), output_dtype=dtype)
        return self.score_trees(req)[0].features

    def prefix_cache(self, clear: bool = False) -> Dict[str, int]:
        """The workers' score_trees prefix cache stats, summed (``clear``: empty every worker's first; admin)."""
        total: Dict[str, int] = {}
        for c in self.workers.values():
            for k, v in c.prefix_cache(clear=clear).items():
                if isinstance(v, (int, float)):
                    total[k] = total.get(k, 0) + v
        return total

    # ---- traffic ---------------------------------------------------------------------------------------------------
    def traffic_page(self, after: int, spool_id: Optional[str], max_items: int, *,
                     worker: Optional[str] = None) -> Dict[str, Any]:
        """One raw spool page of ``worker`` (may be omitted in a fleet of one): as
        :meth:`SpecOPDClient.traffic_page`, plus ``"worker"``; the page's spool id is remembered as that worker's
        (for :meth:`traffic_features`). Raises ValueError without ``worker`` in a fleet of several."""
        if worker is None:
            if len(self.workers) != 1:
                raise ValueError("traffic_page on a fleet: name the worker whose spool to read")
            worker = self.worker_urls[0]
        page = self.workers[worker].traffic_page(after, spool_id, max_items)
        if isinstance(page.get("spool_id"), str):
            self._spools[page["spool_id"]] = worker
        return {**page, "worker": worker}

    def traffic_features(self, seqs: List[int], spool_id: Optional[str] = None):
        """Features captured while serving, from the worker whose spool ``spool_id`` is (as
        :meth:`SpecOPDClient.traffic_features`). Raises :class:`ServerRequestError` 409 for a spool id no page
        read by this client came from."""
        worker = self._spools.get(spool_id) if spool_id is not None else None
        if worker is None:
            raise ServerRequestError(409, f"spool {spool_id!r} is not a spool this client read from")
        return self.workers[worker].traffic_features(seqs, spool_id)

    def traffic(self, max_items: int) -> List[Dict[str, Any]]:
        """Up to ``max_items`` new items of EACH worker's spool (each worker's client keeps its cursor), every item
        with ``"worker"``; a worker that does not answer is skipped this time (its cursor stays).
        ``last_traffic``: ``missed`` (summed) and the total backlog as ``stats.newest_seq - next_after``."""
        items: List[Dict[str, Any]] = []
        missed = backlog = 0
        for url, c in self.workers.items():
            try:
                got = c.traffic(max_items)
            except ServerUnavailableError:
                self.health.mark_down(url)
                continue
            items += [{**it, "worker": url} for it in got]
            rep = c.last_traffic
            if rep is not None:
                missed += int(rep.missed)
                backlog += max(0, int(rep.stats.newest_seq) - int(rep.next_after))
        self.last_traffic = SimpleNamespace(missed=missed, next_after=0, stats=SimpleNamespace(newest_seq=backlog))
        return items

    def purge_traffic(self) -> int:
        """Drop every worker's spool items (admin); how many were dropped in all."""
        return sum(c.purge_traffic() for c in self.workers.values())


def rank_share(workers: Sequence[str], rank: int, world: int) -> List[str]:
    """The workers rank ``rank`` of ``world`` tries first: ``workers[rank::world]`` (every rank gets at least one:
    with fewer workers than ranks, worker ``rank % len(workers)``). Raises ValueError for no workers or a rank
    outside ``[0, world)``."""
    if not workers or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world} over {len(workers)} worker(s)")
    return list(workers[rank::world]) or [workers[rank % len(workers)]]
