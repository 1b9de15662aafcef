"""User traffic for the main job and the traffic-shift benchmark: chat completions through SGLang's OpenAI API.

:class:`ChatLoad` runs ``streams`` threads; each sends one ``POST /v1/chat/completions`` at a time (not streamed)
from a shared, cycled list of prompt records (``{"id", "domain", "messages"}``) until :meth:`stop`, as users of an
OpenAI-compatible endpoint would. Per request it keeps: domain, send / finish time (seconds on its clock), HTTP
status or failure kind (``timeout`` / ``connection`` / ``malformed``), and the completion tokens. With ``stream=True``
the replies are streamed (server-sent events) and each request also keeps the gaps between its content chunks
(``itl_s``: inter-token latency as SGLang's ``bench_serving`` measures it, one gap per chunk after the first; a
speculative step that emits several tokens sends them in one chunk) and its time to first chunk. Prompt order:
:func:`mixed`, each domain shuffled with a seed then taken round-robin, so every stretch of traffic has the same mix.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple


@dataclass(frozen=True)
class ChatRecord:
    """One served chat request: ``error`` is None for HTTP 200 with ``usage``, else the status or failure kind."""

    id: str
    domain: str
    sent_s: float
    done_s: float
    status: Optional[int]
    error: Optional[str]
    completion_tokens: int
    ttft_s: Optional[float] = None
    itl_s: Tuple[float, ...] = ()


def mixed(records: Sequence[Mapping[str, Any]], seed: int = 0) -> List[Mapping[str, Any]]:
    """``records`` shuffled per domain (``random.Random(seed)``) and interleaved round-robin across domains (a smaller
    domain starts over when it runs out)."""
    rng = random.Random(seed)
    by: Dict[str, List[Mapping[str, Any]]] = {}
    for r in records:
        by.setdefault(str(r["domain"]), []).append(r)
    per = []
    for d in sorted(by):
        mine = list(by[d])
        rng.shuffle(mine)
        per.append(mine)
    rounds = max((len(m) for m in per), default=0)
    return [m[i % len(m)] for i in range(rounds) for m in per]


def blend(new: Sequence[Mapping[str, Any]], old: Sequence[Mapping[str, Any]],
          old_share: float) -> List[Mapping[str, Any]]:
    """``new`` with ``old`` interleaved so that a fraction ``old_share`` (0 <= share < 1) of the list comes from
    ``old``, spread evenly (item ``i`` is old when ``floor((i + 1) * share) > floor(i * share)``), each list cycled
    in its order: the traffic after a shift, where the earlier users keep coming as a minority.

    Raises ValueError: ``old_share`` outside [0, 1) or an empty ``new`` (or an empty ``old`` with a share > 0)."""
    if not 0.0 <= old_share < 1.0:
        raise ValueError(f"old_share must be in [0, 1), got {old_share}")
    if not new or (old_share > 0 and not old):
        raise ValueError("blend needs new records (and old ones when old_share > 0)")
    if old_share == 0:
        return list(new)
    total = int(round(len(new) / (1.0 - old_share)))
    out: List[Mapping[str, Any]] = []
    i_new = i_old = 0
    for i in range(total):
        if int((i + 1) * old_share) > int(i * old_share):
            out.append(old[i_old % len(old)])
            i_old += 1
        else:
            out.append(new[i_new % len(new)])
            i_new += 1
    return out


class ChatLoad:
    """``streams`` threads sending ``records`` (cycled) to ``url``'s ``/v1/chat/completions``.

    Args:
        max_tokens / temperature: per request. api_key: SGLang's ``--api-key`` if any. clock: seconds.
        on_done: called with each :class:`ChatRecord` (from the sending thread).
    """

    def __init__(self, url: str, records: Sequence[Mapping[str, Any]], *, streams: int, max_tokens: int,
                 temperature: float = 0.0, api_key: Optional[str] = None, timeout_s: float = 600.0,
                 stream: bool = False,
                 clock: Callable[[], float] = time.monotonic,
                 on_done: Optional[Callable[[ChatRecord], None]] = None):
        if not records:
            raise ValueError("no prompt records")
        if streams < 1:
            raise ValueError(f"streams must be >= 1, got {streams}")
        self.url = url.rstrip("/") + "/v1/chat/completions"
        self.streams, self.max_tokens, self.temperature, self.stream = streams, max_tokens, temperature, stream
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s, self.clock, self.on_done = timeout_s, clock, on_done
        self._next = itertools.cycle(list(records))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self.records: List[ChatRecord] = []

    def start(self) -> "ChatLoad":
        for i in range(self.streams):
            t = threading.Thread(target=self._run, name=f"chat-load-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, join_s: float = 600.0) -> List[ChatRecord]:
        """Stop sending; wait for the requests in flight; the records."""
        self._stop.set()
        for t in self._threads:
            t.join(join_s)
        return self.snapshot()

    def snapshot(self) -> List[ChatRecord]:
        with self._lock:
            return list(self.records)

    def __enter__(self) -> "ChatLoad":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=10.0), headers=self.headers) as client:
            while not self._stop.is_set():
                with self._lock:
                    rec = next(self._next)
                body = {"model": "default", "messages": list(rec["messages"]), "max_tokens": self.max_tokens,
                        "temperature": self.temperature}
                sent, status, error, tokens, ttft, gaps = self.clock(), None, None, 0, None, ()
                try:
                    if self.stream:
                        status, error, tokens, ttft, gaps = self._streamed(client, body, sent)
                    else:
                        r = client.post(self.url, json=body)
                        status = r.status_code
                        if status != 200:
                            error = str(status)
                        else:
                            usage = r.json().get("usage") or {}
                            tokens = int(usage.get("completion_tokens", 0))
                            if "completion_tokens" not in usage:
                                error = "malformed"
                except httpx.TimeoutException:
                    error = "timeout"
                except (httpx.HTTPError, OSError, ValueError):
                    error = "connection"
                out = ChatRecord(str(rec["id"]), str(rec["domain"]), sent, self.clock(), status, error, tokens,
                                 ttft, tuple(gaps))
                with self._lock:
                    self.records.append(out)
                if self.on_done is not None:
                    self.on_done(out)

    def _streamed(self, client, body: Dict[str, Any], sent: float):
        """One streamed request: (status, error, completion tokens, time to first chunk, gaps between chunks)."""
        import json

        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        times: List[float] = []
        tokens, error = 0, None
        with client.stream("POST", self.url, json=body) as r:
            if r.status_code != 200:
                r.read()
                return r.status_code, str(r.status_code), 0, None, ()
            buf = b""
            for part in r.iter_bytes():
                buf += part
                while b"\n" in buf:  # split on newline only (a sampled U+2028 inside JSON is not a line break)
                    line, buf = buf.split(b"\n", 1)
                    line = line.strip()
                    if not line.startswith(b"data:") or line == b"data: [DONE]":
                        continue
                    try:
                        chunk = json.loads(line[5:])
                    except ValueError:
                        error = "malformed"
                        continue
                    usage = chunk.get("usage") or {}
                    if usage.get("completion_tokens") is not None:
                        tokens = int(usage["completion_tokens"])
                    if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                        times.append(self.clock())
        gaps = [b - a for a, b in zip(times, times[1:])]
        return 200, error, tokens, (times[0] - sent) if times else None, gaps
