"""The score_trees line in the HTTP process: a bounded queue with a bounded wait, answered 429 + Retry-After.

One score request at a time is with the scheduler (its communicator holds one call in flight); the others wait
here, first come first served. Two bounds, both answered 429 with ``Retry-After`` (whole seconds, at least 1:
the expected time until a place is free, from the recent mean scoring time):

* places: at most ``queue_max`` requests wait while one is scored (``score_trees_queue_max``); one more is
  refused at once ("queue is full");
* waiting time: a request waits at most ``wait_s`` seconds for its turn (``score_trees_queue_wait_s``; 0 = no
  bound). It is refused at once when the line ahead of it is already expected to take longer (from the mean
  scoring time and how long the request being scored has run), else when its wait reaches ``wait_s``. So a
  small request behind a long one gets either a timely answer or a 429, never a silent wait (issue 41: 12 small
  requests had no answer within 15 s while others were scored at a 64-row budget).

The wait is measured from the moment the request took its place (after its body was read) to the moment it is
handed to the scheduler (:attr:`Ticket.waited_s`); the route reports it in the reply header
``X-SpecOPD-Queue-Wait-S`` (:data:`sglang_specopd.wire.protocol.QUEUE_WAIT_HEADER`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Optional


class LineBusy(Exception):
    """The request cannot wait here: ``retry_after`` (seconds, >= 1) and a one-line ``message`` for the 429."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.message, self.retry_after = message, retry_after


@dataclass
class Ticket:
    """One request's place in the line: when it arrived, and when it got its turn (None while waiting)."""

    arrived: float = field(default_factory=time.monotonic)
    turn_at: Optional[float] = None

    @property
    def waited_s(self) -> float:
        """Seconds between arrival and turn (up to now while still waiting)."""
        return (self.turn_at if self.turn_at is not None else time.monotonic()) - self.arrived


class ScoreLine:
    """The line (see the module docstring). ``clock``: seconds, monotonic (replaceable in tests).

    Use: ``ticket = line.enter()`` (LineBusy when full), ``await line.turn(ticket)`` (LineBusy when the wait
    bound is or would be exceeded; the place is given back then), then ``line.done(ticket, scored_s)`` once the
    scheduler answered (or ``line.leave(ticket)`` for a request that never got its turn).
    """

    def __init__(self, queue_max: int, wait_s: float = 0.0, clock=time.monotonic):
        self.queue_max, self.wait_s, self.clock = queue_max, wait_s, clock
        self.mean_s: Optional[float] = None  # exponential mean of recent scored requests' durations
        self.busy_since: Optional[float] = None  # when the request now with the scheduler got its turn
        self._waiting: Deque[asyncio.Future] = deque()
        self.active = 0  # places taken: waiting + the one being scored

    # --- places ---------------------------------------------------------------------------------------------
    def enter(self) -> Ticket:
        """Take a place; LineBusy ("queue is full") when ``queue_max`` wait already and one is being scored."""
        if self.active >= self.queue_max + 1:
            raise LineBusy(f"score_trees queue is full ({self.queue_max} waiting and one being scored); retry in "
                           f"{self.retry_after()} s", self.retry_after())
        self.active += 1
        return Ticket(arrived=self.clock())

    def leave(self, ticket: Ticket) -> None:
        """Give back a place that never got its turn (the request was refused after :meth:`enter`)."""
        self.active -= 1

    # --- turns ----------------------------------------------------------------------------------------------
    def expected_wait_s(self, ahead: Optional[int] = None) -> float:
        """Seconds until a request behind ``ahead`` waiting ones (default: all now waiting) gets its turn:
        the rest of the running request's expected time plus one mean time per request ahead."""
        if self.busy_since is None and not self._waiting:
            return 0.0
        mean = self.mean_s or 1.0
        ahead = len(self._waiting) if ahead is None else ahead
        running_left = max(0.0, mean - (self.clock() - self.busy_since)) if self.busy_since is not None else 0.0
        return running_left + mean * ahead

    def retry_after(self) -> int:
        """Whole seconds until a place is likely free (at least 1)."""
        return max(1, math.ceil(self.expected_wait_s(0) if self.busy_since is not None else (self.mean_s or 1.0)))

    async def turn(self, ticket: Ticket) -> None:
        """Wait for the request's turn. LineBusy (and the place given back) when the wait bound is exceeded or
        expected to be; CancelledError passes through (the place is given back, a turn already granted passed on)."""
        if self.busy_since is None and not self._waiting:
            self._grant(ticket)
            return
        if self.wait_s > 0:
            waited = self.clock() - ticket.arrived
            expected = self.expected_wait_s()
            if self.mean_s is not None and waited + expected > self.wait_s:
                self.leave(ticket)
                wait = max(1, math.ceil(expected))
                raise LineBusy(f"score_trees queue wait would exceed score_trees_queue_wait_s {self.wait_s:g} s "
                               f"(about {expected:.1f} s of scoring ahead); retry in {wait} s", wait)
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        timeout = None if self.wait_s <= 0 else max(0.0, self.wait_s - (self.clock() - ticket.arrived))
        try:
            await asyncio.wait_for(fut, timeout=timeout)
        except asyncio.TimeoutError:
            self._forget(fut)
            self.leave(ticket)
            raise LineBusy(f"score_trees queue wait reached score_trees_queue_wait_s {self.wait_s:g} s; retry in "
                           f"{self.retry_after()} s", self.retry_after()) from None
        except BaseException:
            self._forget(fut)
            if fut.done() and not fut.cancelled():  # granted just as we were cancelled: pass the turn on
                self.busy_since = None
                self._next()
            self.leave(ticket)
            raise
        ticket.turn_at = self.clock()

    def done(self, ticket: Ticket, scored_s: Optional[float] = None) -> None:
        """The request that had the turn is answered (``scored_s``: the scheduler's time, when it scored it):
        its place is given back and the next waiting request gets the turn."""
        if scored_s is not None:
            self.mean_s = scored_s if self.mean_s is None else 0.7 * self.mean_s + 0.3 * scored_s
        self.active -= 1
        self.busy_since = None
        self._next()

    def _grant(self, ticket: Ticket) -> None:
        self.busy_since = ticket.turn_at = self.clock()

    def _next(self) -> None:
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                self.busy_since = self.clock()
                fut.set_result(True)
                return

    def _forget(self, fut: asyncio.Future) -> None:
        try:
            self._waiting.remove(fut)
        except ValueError:
            pass
