"""Budgeted ``/specopd/score_trees`` in the scheduler: scoring shares the scheduler loop with generation.

With ``score_trees_budget_tokens`` B > 0 (``SPECOPD_SCORE_BUDGET_TOKENS``), a score request (a
:class:`~sglang_specopd.server.control.SpecOPDScoreReq`) is parsed and checked when the scheduler dispatches it
(a bad one is answered 400 at once) and queued as a job: a :func:`~sglang_specopd.server.scoring.chunks.score_trees_steps`
generator. Once per scheduler iteration, right after the scheduler has taken in new requests
(an AFTER hook on ``Scheduler.ingest_requests``, which every event loop calls once per iteration), pieces of the
queued jobs run while another piece like the last one still fits in B rows (a piece is at most B rows, unless one
anchor tree alone is larger), then the scheduler goes on with its batch: decode steps run between pieces. The reply is sent
(``Scheduler.send_control_output``, SGLang's deferred control reply) when a job's last piece has run.
While jobs are queued the idle scheduler does not sleep (an AROUND hook on ``Scheduler.maybe_sleep_on_idle``);
no piece runs while the engine is paused; a job that was mid-way when the target's weights changed starts over,
so every reply is computed by one set of weights. With B = 0 the request runs whole at dispatch (unbudgeted).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Optional

from sglang_specopd.server import compat
from sglang_specopd.server.control import SpecOPDScoreOutput, SpecOPDScoreReq
from sglang_specopd.server.prefix_cache import weight_updates
from sglang_specopd.server.scoring.chunks import run_to_end, score_trees_steps
from sglang_specopd.server.scoring.cost import ScoreSettings
from sglang_specopd.server.scoring.forward import parse_score_request

logger = logging.getLogger("sglang_specopd.server.scoring.queue")


@dataclass
class ScoreJob:
    """One queued request: the IPC request to answer, the parsed request, its pieces generator and progress."""

    recv_req: object
    req: object
    steps: object
    weights: int
    rows: int = 0
    pieces: int = 0
    restarts: int = 0
    started: float = field(default_factory=time.monotonic)


def _reply(status: int, message: str, payload: bytes = b"") -> SpecOPDScoreOutput:
    return SpecOPDScoreOutput(status=status, message=message, payload=payload)


def _failure(exc: Exception) -> SpecOPDScoreOutput:
    """400 for a ValueError (bad input found late), 500 (logged) for anything else: never a dead scheduler."""
    if isinstance(exc, ValueError):
        return _reply(400, str(exc))
    logger.error("score_trees failed:\n%s", traceback.format_exc())
    return _reply(500, f"{type(exc).__name__}: {exc}")


class ScoreQueue:
    """The scheduler's queue of budgeted score jobs (FIFO; the HTTP side bounds how many wait)."""

    def __init__(self, settings: ScoreSettings):
        self.settings = settings
        self.jobs: Deque[ScoreJob] = deque()

    def submit(self, scheduler, recv_req: SpecOPDScoreReq) -> Optional[SpecOPDScoreOutput]:
        """Dispatch one request: the reply now (a 4xx, or the whole result when the budget is off), or None when
        it was queued (answered later by :meth:`step`)."""
        try:
            req = parse_score_request(scheduler, recv_req.payload)
            budget = self.settings.budget_tokens
            if budget <= 0:
                return _reply(*run_to_end(score_trees_steps(scheduler, req)))
        except Exception as exc:
            return _failure(exc)
        self.jobs.append(ScoreJob(recv_req, req, score_trees_steps(scheduler, req, budget), weight_updates()))
        return None

    def step(self, scheduler) -> int:
        """Run pieces of the queued jobs, in order, while another piece the size of the last one still fits in
        ``budget_tokens`` rows (at least one piece); send the reply of every job that finished. Returns the rows
        run."""
        budget, spent, last = self.settings.budget_tokens, 0, 0
        # another piece only while one more like the last still fits: pieces are at most B rows (prefix chunks of B,
        # tree slices up to B), so an iteration runs at most about B rows, and small references share one
        while self.jobs and (spent == 0 or spent + last <= budget):
            job = self.jobs[0]
            if job.weights != weight_updates():  # the target changed under a half-scored request: start over
                job.steps.close()
                job.steps, job.weights, job.restarts = (score_trees_steps(scheduler, job.req, budget),
                                                        weight_updates(), job.restarts + 1)
            try:
                rows = next(job.steps)
            except StopIteration as stop:
                out = _reply(*stop.value)
            except Exception as exc:
                out = _failure(exc)
            else:
                spent, last, job.rows, job.pieces = spent + rows, rows, job.rows + rows, job.pieces + 1
                continue
            self.jobs.popleft()
            logger.debug("score_trees job done: %d rows in %d pieces, %.2f s, %d restarts", job.rows, job.pieces,
                         time.monotonic() - job.started, job.restarts)
            scheduler.send_control_output(out, job.recv_req)
        return spent


_QUEUE: Optional[ScoreQueue] = None


def scheduler_queue() -> ScoreQueue:
    """This process's queue (the scheduler's), with settings from the environment on first use."""
    global _QUEUE
    if _QUEUE is None:
        _QUEUE = ScoreQueue(ScoreSettings.from_env())
    return _QUEUE


def submit(scheduler, recv_req: SpecOPDScoreReq) -> Optional[SpecOPDScoreOutput]:
    """The scheduler's dispatch of a :class:`SpecOPDScoreReq` (see :meth:`ScoreQueue.submit`)."""
    return scheduler_queue().submit(scheduler, recv_req)


def add_score_dispatch(result, self, *args, **kwargs):
    """AFTER hook for ``Scheduler.init_request_dispatcher``: route SpecOPDScoreReq to :func:`submit`."""
    TypeBasedDispatcher = compat.get("TypeBasedDispatcher")

    self._request_dispatcher += TypeBasedDispatcher([(SpecOPDScoreReq, lambda r: submit(self, r))])
    return result


def run_score_pieces(result, self, *args, **kwargs):
    """AFTER hook for ``Scheduler.ingest_requests`` (once per scheduler iteration): one budget of scoring pieces,
    unless nothing is queued or the engine is paused."""
    queue = _QUEUE
    if queue is not None and queue.jobs and not getattr(self, "_engine_paused", False):
        queue.step(self)
    return result


def no_idle_sleep_while_scoring(original_fn, self, *args, **kwargs):
    """AROUND hook for ``Scheduler.maybe_sleep_on_idle``: an idle scheduler with queued score jobs goes straight
    on to the next iteration (the next piece) instead of waiting up to a second for a request."""
    if _QUEUE is not None and _QUEUE.jobs:
        return None
    return original_fn(self, *args, **kwargs)


def register_score_queue() -> None:
    """Register the score request's dispatch, the per-iteration piece runner and the idle-sleep guard."""
    compat.hook("Scheduler.init_request_dispatcher", add_score_dispatch)
    compat.hook("Scheduler.ingest_requests", run_score_pieces)
    compat.hook("Scheduler.maybe_sleep_on_idle", no_idle_sleep_while_scoring)
