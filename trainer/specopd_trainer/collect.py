"""Regenerate training responses with the target itself, through a live server, into a resumable JSONL cache.

SpecForge's advice for drafter training: train on the target's *own* responses, not on the dataset's. Each prompt
record ``{"id", "domain", "messages"}`` is rendered with the target's chat template (``add_generation_prompt``),
sent to ``/generate`` (several requests in flight), and every finished item is appended to the cache as one JSON
line ``{"id", "domain", "prompt_ids", "response_ids", "finish_reason"}`` (append + flush + fsync per line).
``response_ids`` are SGLang's ``output_ids`` as returned (an EOS that ended the response is kept, since the
drafter must learn to predict it); ``finish_reason`` is SGLang's ``finish_reason.type`` (``"stop"``/``"length"``).

Crash safety and resume: only newline-terminated lines count. A partially written last line (a crash mid-write)
is ignored by :func:`iter_responses` and cut off by :func:`repair_cache` before :func:`regenerate` appends again;
ids already in the cache are skipped, so re-running the same command resumes. Nothing is held in memory but the
set of cached ids: records may be an iterator and :func:`iter_responses` streams.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from specopd_trainer.client.http import ServerError, ServerRequestError, SpecOPDClient

log = logging.getLogger(__name__)

_KEEP_IDS = 20  # how many skipped/rejected ids and reasons a ResponseCache reports by name


class CollectionError(RuntimeError):
    """Collection stopped early (server down, auth refused, malformed reply). Everything finished is cached.

    ``cached``: complete responses in the cache now; ``new``: how many of them this run added.
    """

    def __init__(self, message: str, *, cached: int = 0, new: int = 0):
        super().__init__(message)
        self.cached = cached
        self.new = new


class CacheFormatError(ValueError):
    """A cache line other than an unterminated last line is not a valid response record (``file:line``)."""


class InvalidRecordError(ValueError):
    """A prompt record lacks a string ``id`` or a non-empty ``messages`` list."""


@dataclass(frozen=True)
class CachedResponse:
    """One cached response: token ids of the templated prompt and of the target's reply."""

    id: str
    domain: str
    prompt_ids: Tuple[int, ...]
    response_ids: Tuple[int, ...]
    finish_reason: Optional[str]


@dataclass(frozen=True)
class ResponseCache:
    """The cache file after a :func:`regenerate` run, with that run's counts. Iterating streams the cache.

    Counts: ``cached`` complete responses in the file now; ``new`` added by this run; ``resumed`` records skipped
    because their id was already cached (or repeated in the input); ``too_long`` prompts over
    ``max_prompt_tokens`` (never sent; first ids in ``too_long_ids``); ``rejected`` prompts the server refused
    with HTTP 4xx (first reasons in ``rejected_reasons``). Tokens and time are this run's: ``prompt_tokens``
    and ``response_tokens`` of the new responses, ``wall_s`` in seconds.
    """

    path: Path
    cached: int
    new: int
    resumed: int
    too_long: int
    too_long_ids: Tuple[str, ...]
    rejected: int
    rejected_reasons: Tuple[str, ...]
    prompt_tokens: int
    response_tokens: int
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        """Response tokens generated per second of this run (0.0 for an empty run)."""
        return self.response_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def __iter__(self) -> Iterator[CachedResponse]:
        return iter_responses(self.path)


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> List[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template plus the generation prompt."""
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    if isinstance(ids, Mapping):  # tokenizers that ignore return_dict=False
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _complete_lines(path: Path) -> Iterator[Tuple[int, bytes]]:
    """``(line_no, line)`` for every newline-terminated line; an unterminated tail is dropped."""
    with open(path, "rb") as fh:
        for no, line in enumerate(fh, 1):
            if line.endswith(b"\n"):
                yield no, line


def iter_responses(cache_path: str | os.PathLike[str]) -> Iterator[CachedResponse]:
    """Stream the cache's responses in file order; a missing file yields nothing.

    Raises:
        CacheFormatError: a complete line that is not a valid record (only an unterminated last line,
            i.e. a crash mid-write, is silently ignored).
    """
    path = Path(cache_path)
    if not path.exists():
        return
    for no, line in _complete_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            yield CachedResponse(id=str(obj["id"]), domain=str(obj["domain"]),
                                 prompt_ids=tuple(int(t) for t in obj["prompt_ids"]),
                                 response_ids=tuple(int(t) for t in obj["response_ids"]),
                                 finish_reason=obj.get("finish_reason"))
        except (ValueError, KeyError, TypeError) as exc:
            raise CacheFormatError(f"{path}:{no}: not a response record ({exc})") from None


def cached_ids(cache_path: str | os.PathLike[str]) -> Set[str]:
    """Ids of the complete responses in the cache (empty if the file does not exist)."""
    return {r.id for r in iter_responses(cache_path)}


def repair_cache(cache_path: str | os.PathLike[str]) -> int:
    """Cut an unterminated last line (left by a crash) off the cache; return how many bytes were removed."""
    path = Path(cache_path)
    if not path.exists():
        return 0
    size = path.stat().st_size
    with open(path, "rb+") as fh:
        keep = 0
        for line in fh:
            if not line.endswith(b"\n"):
                break
            keep += len(line)
        if keep < size:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
    return size - keep


def _append_line(fh, obj: Dict[str, Any]) -> None:
    fh.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    fh.flush()
    os.fsync(fh.fileno())


def _generate_one(client: SpecOPDClient, prompt_ids: List[int], params: Dict[str, Any]) -> Tuple[List[int], Any]:
    resp = client.generate(prompt_ids, **params)
    out = resp.get("output_ids") if isinstance(resp, dict) else None
    if not isinstance(out, list) or not all(isinstance(t, int) for t in out):
        raise ServerError(f"/generate reply without integer output_ids: {str(resp)[:200]}")
    finish = (resp.get("meta_info") or {}).get("finish_reason")
    return out, (finish.get("type") if isinstance(finish, dict) else finish)


class _LogStatus:
    """One progress line per ``every_s`` on stderr when it is not a terminal (nohup logs), with an ETA."""

    def __init__(self, enabled: bool, total: Optional[int], already: int, every_s: float = 60.0):
        self.enabled, self.total, self.already, self.every_s = enabled, total, already, every_s
        self.t0 = self.last = time.monotonic()

    def tick(self, new: int, tokens: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < self.every_s:
            return
        self.last = now
        rate = new / (now - self.t0)
        left = (self.total - self.already - new) if self.total is not None else None
        eta = f", ETA {left / rate / 60:.0f} min" if left is not None and rate > 0 else ""
        print(f"regenerate: {self.already + new}/{self.total or '?'} responses (+{new} this run), "
              f"{tokens / (now - self.t0):.1f} tok/s{eta}", file=sys.stderr, flush=True)


def _progress(enabled: bool):
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn("[bold]regenerate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[tps]:.1f} tok/s"),
                    disable=not enabled, transient=False)


def regenerate(client: SpecOPDClient, tokenizer: Any, records: Iterable[Mapping[str, Any]],
               cache_path: str | os.PathLike[str], *, max_new_tokens: int = 256, max_prompt_tokens: int = 1024,
               temperature: float = 0.0, concurrency: int = 16, progress: bool = True) -> ResponseCache:
    """Generate the target's response to every record not yet cached and append it to ``cache_path``.

    Args:
        client: a :class:`SpecOPDClient` on the live server (it retries with backoff itself; it is shared by
            the ``concurrency`` worker threads, httpx clients being thread-safe).
        tokenizer: the target's tokenizer (its chat template renders the prompts).
        records: prompt records ``{"id", "domain", "messages"}``; any iterable, consumed lazily. A record may carry
            its own ``temperature`` and ``sampling_seed`` (several samples of one prompt, :mod:`.data.corpus`).
        max_new_tokens: response budget per prompt, in tokens. temperature: 0 = greedy (records without their own).
        max_prompt_tokens: templated prompts longer than this (tokens) are skipped, counted and never sent.
        concurrency: requests in flight at once (at most ``2 * concurrency`` records are read ahead).

    Returns: the :class:`ResponseCache` with this run's counts.

    Raises:
        CollectionError: the server stayed unreachable after the client's retries, refused authentication
            (401/403) or sent a malformed reply; its message says how many responses are cached and that
            re-running resumes. InvalidRecordError: a record without ``id``/``messages``.
    """
    if concurrency < 1 or max_new_tokens < 1 or max_prompt_tokens < 1:
        raise ValueError("concurrency, max_new_tokens and max_prompt_tokens must be >= 1")
    path = Path(cache_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if (dropped := repair_cache(path)):
        log.warning("%s: dropped an unterminated last line (%d bytes) left by an interrupted run", path, dropped)
    seen = cached_ids(path)
    already = len(seen)
    params = {"max_new_tokens": max_new_tokens, "temperature": temperature}
    total = len(records) if hasattr(records, "__len__") else None  # type: ignore[arg-type]
    counts = dict(new=0, resumed=0, too_long=0, rejected=0, prompt_tokens=0, response_tokens=0)
    too_long_ids: List[str] = []
    rejected: List[str] = []
    fatal: Optional[BaseException] = None
    t0 = time.monotonic()
    pending: Dict[Future, Tuple[str, str, List[int]]] = {}
    status = _LogStatus(progress and not sys.stderr.isatty(), total, already)

    with _progress(progress) as bar, ThreadPoolExecutor(concurrency, "specopd-collect") as pool, \
            open(path, "ab") as fh:
        task = bar.add_task("regenerate", total=total, tps=0.0)

        def drain(block_until_empty: bool) -> None:
            nonlocal fatal
            while pending and (block_until_empty or len(pending) >= 2 * concurrency):
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for fut in done:
                    rid, domain, prompt = pending.pop(fut)
                    if fut.cancelled():
                        continue
                    try:
                        out, finish = fut.result()
                    except ServerRequestError as exc:
                        if exc.status in (401, 403):
                            fatal = fatal or exc
                        else:
                            counts["rejected"] += 1
                            if len(rejected) < _KEEP_IDS:
                                rejected.append(f"{rid}: {exc}")
                        bar.advance(task)
                        continue
                    except Exception as exc:  # ServerUnavailableError, malformed reply, bugs: stop the run
                        fatal = fatal or exc
                        continue
                    _append_line(fh, {"id": rid, "domain": domain, "prompt_ids": prompt, "response_ids": out,
                                      "finish_reason": finish})
                    counts["new"] += 1
                    counts["prompt_tokens"] += len(prompt)
                    counts["response_tokens"] += len(out)
                    bar.update(task, advance=1, tps=counts["response_tokens"] / max(time.monotonic() - t0, 1e-9))
                    status.tick(counts["new"], counts["response_tokens"])
                if fatal is not None:
                    for fut in pending:
                        fut.cancel()  # not yet started: never sent; running ones finish and are still written

        for rec in records:
            if fatal is not None:
                break
            rid, messages = rec.get("id"), rec.get("messages")
            if not isinstance(rid, str) or not rid or not isinstance(messages, list) or not messages:
                fatal = InvalidRecordError(f"record needs a non-empty string 'id' and 'messages': {rec!s:.200}")
                break
            if rid in seen:
                counts["resumed"] += 1
                bar.advance(task)
                continue
            seen.add(rid)
            prompt = chat_prompt_ids(tokenizer, messages)
            if len(prompt) > max_prompt_tokens:
                counts["too_long"] += 1
                if len(too_long_ids) < _KEEP_IDS:
                    too_long_ids.append(rid)
                bar.advance(task)
                continue
            own = {k: rec[k] for k in ("temperature", "sampling_seed") if rec.get(k) is not None}
            pending[pool.submit(_generate_one, client, prompt, {**params, **own} if own else params)] = (rid, str(rec.get("domain", "")), prompt)
            drain(block_until_empty=False)
        drain(block_until_empty=True)

    cached = already + counts["new"]
    if counts["too_long"]:
        log.warning("skipped %d prompts longer than max_prompt_tokens=%d (first: %s)", counts["too_long"],
                    max_prompt_tokens, ", ".join(too_long_ids[:5]))
    if counts["rejected"]:
        log.warning("the server rejected %d prompts (first: %s)", counts["rejected"], rejected[0])
    if isinstance(fatal, InvalidRecordError):
        raise fatal
    if fatal is not None:
        raise CollectionError(
            f"collection stopped: {type(fatal).__name__}: {fatal}. {cached} responses are cached in {path} "
            f"({counts['new']} from this run); re-running the same command resumes after them.",
            cached=cached, new=counts["new"]) from fatal
    return ResponseCache(path=path, cached=cached, new=counts["new"], resumed=counts["resumed"],
                         too_long=counts["too_long"], too_long_ids=tuple(too_long_ids), rejected=counts["rejected"],
                         rejected_reasons=tuple(rejected), prompt_tokens=counts["prompt_tokens"],
                         response_tokens=counts["response_tokens"], wall_s=time.monotonic() - t0)
