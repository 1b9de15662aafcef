"""The live-traffic load: TRAIN-split prompts of the four domains sent through ``/generate`` as users send them.

Prompts: ``specopd_trainer.data.domain_split(d)[0]`` (the train split; held-out prompts never enter the traffic,
so a drafter trained on it can still be evaluated on them), rendered with the target's chat template, each domain
shuffled with a fixed seed, then interleaved round-robin so that every time window sees the same domain mix (a
domain with few train prompts, dialogue, repeats sooner than the others; the generator cycles through the list).

Each of ``concurrency`` threads sends one request at a time (``POST /generate`` with ``input_ids``, not streamed)
until stopped, and keeps per request: send / finish time (seconds on the benchmark's clock), HTTP status or
failure kind, SGLang's acceptance statistics (``meta_info``: ``completion_tokens``, ``spec_verify_ct``,
``spec_accept_length``) and the drafter versions that proposed its blocks (``meta_info.specopd_drafter_versions``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from sglang_specopd.app.bench.client import BenchPrompt, RequestParams
from soak.procs import LoadStreams

DOMAINS = ("dialogue", "coding", "math", "agentic")


@dataclass(frozen=True)
class ServedRequest:
    """One traffic request. ``sent_s`` / ``done_s``: benchmark clock (s). ``error``: None when served (HTTP 200
    with acceptance statistics), else its key: the HTTP status as a string (``"503"``), ``"timeout"``,
    ``"connection"`` or ``"malformed"`` (a 200 whose JSON lacks ``meta_info.completion_tokens``).
    ``verify_ct``: verify steps (0 when the reply ended after the prefill token or carried none)."""

    seq: int
    id: str
    domain: str
    sent_s: float
    done_s: float
    status: Optional[int]
    error: Optional[str]
    prompt_tokens: int
    completion_tokens: int
    verify_ct: int
    accept_length: Optional[float]
    versions: Tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.error is None


def interleave(prompts: Sequence[BenchPrompt], domains: Sequence[str], seed: int) -> List[BenchPrompt]:
    """Each domain's prompts shuffled (``random.Random(seed)``), then taken round-robin across ``domains`` for as
    many rounds as the largest domain has prompts, a smaller domain starting over when it runs out:
    ``[d0, d1, d2, d3, d0, ...]``, so the domain mix is the same in every stretch of the traffic (cycling the list
    keeps it so). Domains without prompts, and prompts of other domains, are left out."""
    rng = random.Random(seed)
    per = []
    for d in domains:
        mine = [p for p in prompts if p.domain == d]
        rng.shuffle(mine)
        if mine:
            per.append(mine)
    rounds = max((len(m) for m in per), default=0)
    return [m[i % len(m)] for i in range(rounds) for m in per]


def train_prompts(tokenizer: Any, domains: Sequence[str] = DOMAINS, *, max_prompt_tokens: int = 1024,
                  seed: int = 0) -> Tuple[List[BenchPrompt], Dict[str, int]]:
    """The interleaved train-split prompts of ``domains`` and, per domain, how many were skipped as too long."""
    from sglang_specopd.app.bench.runner import load_prompts
    from specopd_trainer.data import domain_split

    records = {d: domain_split(d)[0] for d in domains}
    prompts, skipped = load_prompts(tokenizer, domains, None, records=records, max_prompt_tokens=max_prompt_tokens)
    return interleave(prompts, domains, seed), skipped


def generate_body(prompt: BenchPrompt, max_new_tokens: int, temperature: float, seq: int) -> Dict[str, Any]:
    """The ``/generate`` body of request ``seq`` (T > 0: top_p 1, top_k -1, a seed from the id and ``seq``)."""
    from specopd_trainer.evaluate import sampling_params

    return {"input_ids": list(prompt.prompt_ids),
            "sampling_params": sampling_params(temperature, max_new_tokens, f"{prompt.id}#{seq}")}


def parse_reply(seq: int, prompt: BenchPrompt, sent_s: float, done_s: float, status: Optional[int],
                body: Any, failure: Optional[str] = None) -> ServedRequest:
    """The :class:`ServedRequest` of one reply: ``status`` None with ``failure`` (``"timeout"`` /
    ``"connection"``) when no HTTP reply came; ``body`` the parsed JSON (None if it did not parse)."""
    base = dict(seq=seq, id=prompt.id, domain=prompt.domain, sent_s=sent_s, done_s=done_s, status=status,
                prompt_tokens=len(prompt.prompt_ids))
    empty = dict(completion_tokens=0, verify_ct=0, accept_length=None, versions=())
    if status is None:
        return ServedRequest(error=failure or "connection", **base, **empty)
    if status != 200:
        return ServedRequest(error=str(status), **base, **empty)
    meta = body.get("meta_info") if isinstance(body, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(meta.get("completion_tokens"), int):
        return ServedRequest(error="malformed", **base, **empty)
    versions = tuple(str(v) for v in meta.get("specopd_drafter_versions") or ())
    acc = meta.get("spec_accept_length")
    return ServedRequest(error=None, completion_tokens=int(meta["completion_tokens"]),
                         verify_ct=int(meta.get("spec_verify_ct") or 0),
                         accept_length=float(acc) if acc is not None else None, versions=versions, **base)


class TrafficGenerator(LoadStreams):
    """``concurrency`` threads sending ``prompts`` (cycled, shared) through ``/generate`` until :meth:`stop` (the
    soak's :class:`~soak.procs.LoadStreams` threads, another request); :attr:`records` = [:class:`ServedRequest`]
    in finishing order. ``on_done(record)`` is called per request."""

    def __init__(self, url: str, prompts: Sequence[BenchPrompt], *, concurrency: int, max_new_tokens: int,
                 temperature: float, clock: Callable[[], float], timeout_s: float = 600.0,
                 on_done: Optional[Callable[[ServedRequest], None]] = None):
        super().__init__(url.rstrip("/") + "/generate", prompts, RequestParams(max_new_tokens, temperature),
                         concurrency, clock, lambda *_: None, timeout_s)
        self.on_done = on_done
        self.records: List[ServedRequest] = []  # type: ignore[assignment]
        self.sent = 0

    def snapshot(self) -> List[ServedRequest]:
        with self._lock:
            return list(self.records)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=10.0)) as client:
            while not self._stop.is_set():
                with self._lock:
                    prompt, seq = next(self._next), self.sent
                    self.sent += 1
                body = generate_body(prompt, self.params.max_new_tokens, self.params.temperature, seq)
                sent = self.clock()
                status, reply, failure = None, None, None
                try:
                    r = client.post(self.url, json=body)
                    status = r.status_code
                    try:
                        reply = r.json()
                    except ValueError:
                        reply = None
                except httpx.TimeoutException:
                    failure = "timeout"
                except (httpx.HTTPError, OSError):
                    failure = "connection"
                rec = parse_reply(seq, prompt, sent, self.clock(), status, reply, failure)
                with self._lock:
                    self.records.append(rec)
                if self.on_done is not None:
                    self.on_done(rec)
