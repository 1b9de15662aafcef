"""Streaming requests through SGLang's OpenAI-compatible API, timed on the client.

Every request is ``POST /v1/completions`` with ``stream: true`` and

- ``prompt``: token ids (the held-out prompt rendered with the target's chat template, exactly what
  ``specopd eval acceptance`` sends to ``/generate``);
- ``stream_options: {"include_usage": true, "continuous_usage_stats": true}``: every chunk carries
  ``usage.completion_tokens`` (cumulative), so the number of tokens in each chunk is exact. With speculative
  decoding one chunk carries every token accepted in one verify step (or more, when SGLang coalesced outputs);
- ``return_spec_tokens_details: true``: after the last token chunk SGLang 0.5.23 sends one chunk with
  ``choices: []`` and ``sglext.spec_tokens_details`` = ``{spec_verify_ct, spec_accept_length,
  spec_correct_drafts_histogram, ...}`` for this request (the same numbers ``/generate`` puts in ``meta_info``).
  A server without a drafter sends no such chunk, nor does a request that ended with its prefill token.

With ``api="generate"`` the same request goes to SGLang's native ``POST /generate`` (``input_ids``,
``sampling_params``, ``stream: true``): every chunk's ``meta_info.completion_tokens`` is cumulative and the last one
carries ``spec_verify_ct`` / ``spec_accept_length`` / ``spec_correct_drafts_histogram``. That is the API to use
through sglang-router, whose ``/v1/completions`` takes no token-id prompt and drops ``continuous_usage_stats``
(docs/fleet.md).

Timestamps are ``time.perf_counter()`` on this client when each SSE line arrives. A request succeeds only when the
stream ends with ``data: [DONE]``; a refused request (HTTP status), an error chunk, a dropped connection, a stream
cut short or the per-request timeout make it an error record (``ok`` False, ``error`` says why), never an
exception and never a hang.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import httpx

COMPLETIONS_PATH = "/v1/completions"
GENERATE_PATH = "/generate"
APIS = ("completions", "generate")


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: held-out record id, its domain, and the chat-rendered prompt token ids."""

    id: str
    domain: str
    prompt_ids: Tuple[int, ...]


@dataclass(frozen=True)
class RequestParams:
    """Sampling for every request: ``max_new_tokens`` (tokens), ``temperature`` (0 = greedy), ``ignore_eos``;
    ``spool``: False asks a SPECOPD server not to keep the request in its traffic spool (``custom_params``
    ``specopd_spool``: measurement requests are not traffic to learn from); None sends nothing."""

    max_new_tokens: int
    temperature: float = 0.0
    ignore_eos: bool = False
    spool: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.temperature < 0:
            raise ValueError(f"need max_new_tokens >= 1 and temperature >= 0, got {self}")


@dataclass(frozen=True)
class RequestRecord:
    """Raw client-side numbers of one streamed request (times in seconds, token counts in target tokens).

    ``start_s``: send time since the level started. ``ttft_s``: send -> first chunk carrying a token.
    ``latency_s``: send -> ``[DONE]`` (or -> the failure). ``chunk_times_s`` / ``chunk_tokens``: arrival time
    (since send) and token count of every chunk that carried tokens. ``verify_ct``, ``accept_length``
    (= completion_tokens / verify_ct, SGLang's) and ``histogram`` (bin k = verify steps that accepted k drafts)
    come from ``sglext.spec_tokens_details``; ``verify_ct`` is None when the server sent none.
    """

    id: str
    domain: str
    ok: bool
    error: Optional[str]
    start_s: float
    latency_s: float
    ttft_s: Optional[float]
    prompt_tokens: int
    completion_tokens: int
    chunk_times_s: Tuple[float, ...]
    chunk_tokens: Tuple[int, ...]
    verify_ct: Optional[int]
    accept_length: Optional[float]
    histogram: Tuple[int, ...]
    finish_reason: Optional[str]


class _RequestFailed(Exception):
    """The server refused the request or sent an error chunk (message for the record)."""


@dataclass
class _Stream:
    """Parser state of one SSE stream."""

    tokens: int = 0
    final_tokens: Optional[int] = None
    prompt_tokens: int = 0
    times: List[float] = field(default_factory=list)
    counts: List[int] = field(default_factory=list)
    spec: Optional[Mapping[str, Any]] = None
    finish: Optional[str] = None
    done: bool = False

    def feed(self, obj: Mapping[str, Any], now: float) -> None:
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            raise _RequestFailed(f"error chunk: {err.get('message', err) if isinstance(err, Mapping) else err}")
        usage = obj.get("usage") or {}
        if usage.get("prompt_tokens"):
            self.prompt_tokens = int(usage["prompt_tokens"])
        spec = (obj.get("sglext") or {}).get("spec_tokens_details")
        if spec:
            self.spec = spec[0] if isinstance(spec, list) else spec
        choices = obj.get("choices") or []
        if not choices:
            if usage.get("completion_tokens") is not None:  # the final usage chunk
                self.final_tokens = int(usage["completion_tokens"])
            return
        choice = choices[0]
        if usage.get("completion_tokens") is not None:
            new = int(usage["completion_tokens"]) - self.tokens
        else:  # no continuous usage from this server: one token per chunk with text (bench_serving's fallback)
            new = 1 if choice.get("text") else 0
        if new > 0:
            self.tokens += new
            self.times.append(now)
            self.counts.append(new)
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])

    def feed_generate(self, obj: Mapping[str, Any], now: float) -> None:
        """One chunk of a streaming ``/generate`` reply (``meta_info.completion_tokens`` cumulative)."""
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            raise _RequestFailed(f"error chunk: {err.get('message', err) if isinstance(err, Mapping) else err}")
        meta = obj["meta_info"]
        self.prompt_tokens = int(meta.get("prompt_tokens") or self.prompt_tokens)
        new = int(meta["completion_tokens"]) - self.tokens
        if new > 0:
            self.tokens += new
            self.times.append(now)
            self.counts.append(new)
        finish = meta.get("finish_reason")
        if finish:
            self.finish = str(finish.get("type") if isinstance(finish, Mapping) else finish)
            self.final_tokens = self.tokens
        if meta.get("spec_verify_ct") is not None:
            self.spec = meta


def completion_payload(prompt: BenchPrompt, params: RequestParams) -> Dict[str, Any]:
    """The ``/v1/completions`` body for ``prompt``; T > 0 adds top_p 1, top_k -1 and a seed from the id."""
    from specopd_trainer.evaluate import sampling_params

    body: Dict[str, Any] = {
        "prompt": list(prompt.prompt_ids), "max_tokens": params.max_new_tokens,
        "temperature": float(params.temperature), "ignore_eos": params.ignore_eos, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_spec_tokens_details": True,
    }
    if params.spool is not None:
        body["custom_params"] = {"specopd_spool": params.spool}
    if params.temperature > 0:
        seed = sampling_params(params.temperature, params.max_new_tokens, prompt.id)["sampling_seed"]
        body.update(top_p=1.0, top_k=-1, seed=seed)
    return body


def generate_payload(prompt: BenchPrompt, params: RequestParams) -> Dict[str, Any]:
    """The streaming ``/generate`` body for ``prompt`` (the same sampling as :func:`completion_payload`)."""
    from specopd_trainer.evaluate import sampling_params

    sp = sampling_params(params.temperature, params.max_new_tokens, prompt.id)
    sp["ignore_eos"] = params.ignore_eos
    return {"input_ids": list(prompt.prompt_ids), "sampling_params": sp, "stream": True}


async def sse_lines(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """Lines of a server-sent-event stream, split on ``\\n`` only (a trailing ``\\r`` is left to the caller's strip).

    ``httpx``'s ``aiter_lines`` splits like ``str.splitlines``, also on U+2028, U+0085 and other separators
    that SGLang's JSON (``ensure_ascii=False``) carries raw inside a sampled token's text; that cut one
    ``data:`` line in two and showed as a malformed stream at T=1.
    """
    buf = ""
    async for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split("\n")
        for line in lines:
            yield line
    if buf:
        yield buf


async def _consume(client: httpx.AsyncClient, url: str, body: Mapping[str, Any], state: _Stream,
                   t0: float, feed: Callable[[Mapping[str, Any], float], None]) -> None:
    async with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            text = (await resp.aread())[:300].decode(errors="replace")
            raise _RequestFailed(f"HTTP {resp.status_code}: {text}")
        async for line in sse_lines(resp.aiter_text()):
            line = line.strip()
            if not line.startswith("data:"):
                continue  # blank separators, "event: ..." lines
            data = line[5:].strip()
            now = time.perf_counter() - t0
            if data == "[DONE]":
                state.done = True
                return
            feed(json.loads(data), now)


async def stream_request(client: httpx.AsyncClient, base_url: str, prompt: BenchPrompt, params: RequestParams,
                         *, timeout_s: float, level_t0: float, api: str = "completions") -> RequestRecord:
    """Send one streaming completion (``api`` "completions": ``/v1/completions``; "generate": ``/generate``) and
    time it; failures come back as records with ``ok`` False.

    ``timeout_s`` bounds the whole request (seconds, send -> ``[DONE]``); ``level_t0`` is the level's
    ``perf_counter`` origin for ``start_s``.
    """
    state = _Stream()
    t0 = time.perf_counter()
    error: Optional[str] = None
    if api == "generate":
        path, body, feed = GENERATE_PATH, generate_payload(prompt, params), state.feed_generate
    else:
        path, body, feed = COMPLETIONS_PATH, completion_payload(prompt, params), state.feed
    try:
        await asyncio.wait_for(_consume(client, base_url.rstrip("/") + path, body, state, t0, feed), timeout_s)
        if not state.done:
            error = "stream ended before [DONE] (connection closed by the server)"
    except asyncio.TimeoutError:
        error = f"timeout after {timeout_s:g} s"
    except _RequestFailed as exc:
        error = str(exc)
    except (httpx.HTTPError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}".rstrip(": ")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        error = f"malformed stream: {type(exc).__name__}: {exc}"
    latency = time.perf_counter() - t0
    spec = state.spec or {}
    completion = state.final_tokens if state.final_tokens is not None else state.tokens
    verify = spec.get("spec_verify_ct")
    return RequestRecord(
        id=prompt.id, domain=prompt.domain, ok=error is None, error=error, start_s=t0 - level_t0,
        latency_s=latency, ttft_s=state.times[0] if state.times else None,
        prompt_tokens=state.prompt_tokens or len(prompt.prompt_ids), completion_tokens=completion,
        chunk_times_s=tuple(state.times), chunk_tokens=tuple(state.counts),
        verify_ct=int(verify) if verify is not None else None, accept_length=spec.get("spec_accept_length"),
        histogram=tuple(int(n) for n in spec.get("spec_correct_drafts_histogram") or ()),
        finish_reason=state.finish)


@dataclass(frozen=True)
class LevelRun:
    """All records of one concurrency level (in prompt order) and its wall time ``duration_s`` (seconds)."""

    concurrency: int
    records: Tuple[RequestRecord, ...]
    duration_s: float


def run_level(base_url: str, prompts: Sequence[BenchPrompt], concurrency: int, params: RequestParams, *,
              headers: Optional[Mapping[str, str]] = None, timeout_s: float = 600.0,
              connect_timeout_s: float = 10.0, api: str = "completions") -> LevelRun:
    """Send every prompt once with at most ``concurrency`` requests in flight; block until all have ended.
    ``api``: "completions" (``/v1/completions``, default) or "generate" (``/generate``: through sglang-router).

    ``duration_s`` runs from the first send to the last request's end (as ``bench_serving``'s duration). Each
    request ends within ``timeout_s`` seconds (connecting within ``connect_timeout_s``), so this returns within
    about ``ceil(len(prompts) / concurrency) * timeout_s``. Raises ValueError for concurrency < 1 or no prompts.
    """
    if concurrency < 1 or not prompts:
        raise ValueError(f"need concurrency >= 1 and at least one prompt (got {concurrency}, {len(prompts)})")
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, got {api!r}")

    async def main() -> LevelRun:
        sem = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s, pool=None)
        async with httpx.AsyncClient(headers=dict(headers or {}), timeout=timeout, limits=limits) as client:
            t0 = time.perf_counter()

            async def one(p: BenchPrompt) -> RequestRecord:
                async with sem:
                    return await stream_request(client, base_url, p, params, timeout_s=timeout_s, level_t0=t0,
                                                api=api)

            records = await asyncio.gather(*(one(p) for p in prompts))
            return LevelRun(concurrency, tuple(records), time.perf_counter() - t0)

    return asyncio.run(main())
