"""Acceptance length (tau) per domain on a running speculative-decoding server, from SGLang's own statistics.

Held-out prompts of each domain (the eval split ``domain_split(d)[1]``: 10% of each domain, 16% of dialogue, first
``limit``) are rendered with the target's chat template and sent to ``/generate`` concurrently. For every request
SGLang reports in ``meta_info``: ``completion_tokens``, ``spec_verify_ct`` (verify steps), ``spec_accept_length``
(= completion_tokens / spec_verify_ct, so the token from the prefill counts) and
``spec_correct_drafts_histogram`` (bin k = verify steps that accepted k drafts). Per domain,
``tau = sum(completion_tokens) / sum(spec_verify_ct)`` over its requests (a ratio of sums: long responses weigh
more, as in SGLang's server-wide metric). ``mean_tau`` is the unweighted mean of the per-domain taus.

Measurement requests carry ``custom_params.specopd_spool: false``, so a server that records live traffic for training
(``specopd adapt``) never keeps them: held-out prompts stay held out. Sampling: temperature 0 is greedy. Temperature > 0 uses top_p 1, top_k -1 and a per-request ``sampling_seed``
derived from the prompt id; SGLang honours that seed only when the server runs with
``--enable-deterministic-inference`` (otherwise T>0 runs are statistically, not bitwise, reproducible).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from specopd_trainer.client.http import ServerError, SpecOPDClient
from specopd_trainer.collect import chat_prompt_ids

DOMAINS = ("dialogue", "coding", "math", "agentic")


class EvaluationError(RuntimeError):
    """The evaluation could not run: server unreachable or refusing, no prompts, malformed replies."""


class SpecDecodingUnavailableError(EvaluationError):
    """The server answers without speculative-decoding statistics (it runs no drafter)."""


@dataclass(frozen=True)
class RequestStats:
    """SGLang's statistics for one evaluated request (token counts are in target tokens)."""

    id: str
    domain: str
    prompt_tokens: int
    completion_tokens: int
    verify_steps: int
    accept_length: Optional[float]
    histogram: Tuple[int, ...]
    finish_reason: Optional[str]

    @property
    def histogram_steps(self) -> int:
        """Verify steps counted by the histogram (equals ``verify_steps`` on SGLang 0.5.23)."""
        return sum(self.histogram)

    @property
    def histogram_accepted(self) -> int:
        """Accepted drafts according to the histogram: sum over k of k * steps accepting k drafts."""
        return sum(k * n for k, n in enumerate(self.histogram))


def eval_records(domain: str, limit: Optional[int] = None) -> List[Dict[str, Any]]:
    """The first ``limit`` held-out records of ``domain`` (``specopd_trainer.data.domain_split(d)[1]``).

    Raises the data module's errors (``UnknownDomainError``, ``DataSourceError``).
    """
    from specopd_trainer.data import domain_split

    held = domain_split(domain)[1]
    return list(held if limit is None else held[:limit])


def sampling_params(temperature: float, max_new_tokens: int, request_id: str, *,
                    spool: bool = True) -> Dict[str, Any]:
    """``/generate`` sampling parameters; T > 0 adds top_p 1, top_k -1 and a seed that depends on the id only.
    ``spool=False`` adds ``custom_params.specopd_spool: false``: a server that records live traffic does not keep the
    request (measurements of held-out prompts must never become training traffic)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    params: Dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": float(temperature)}
    if not spool:
        params["custom_params"] = {"specopd_spool": False}
    if temperature > 0:
        seed = int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:4], "big") & 0x7FFFFFFF
        params.update(top_p=1.0, top_k=-1, sampling_seed=seed)
    return params


def request_stats(record: Mapping[str, Any], prompt_len: int, response: Mapping[str, Any]) -> RequestStats:
    """Parse one ``/generate`` reply.

    Raises:
        SpecDecodingUnavailableError: the reply has >= 2 completion tokens but no ``spec_verify_ct`` (only a
            server without speculative decoding does that; a single token comes from the prefill alone).
        EvaluationError: the reply has no ``meta_info.completion_tokens``.
    """
    meta = response.get("meta_info") or {}
    if not isinstance(meta.get("completion_tokens"), int):
        raise EvaluationError(f"/generate reply without meta_info.completion_tokens: {str(response)[:200]}")
    completion = meta["completion_tokens"]
    if "spec_verify_ct" not in meta and completion >= 2:
        raise SpecDecodingUnavailableError(
            "the server does not run speculative decoding: its /generate replies carry no spec_verify_ct "
            f"(meta_info keys: {sorted(meta)}). Start it with a drafter (speculative_algorithm SPECOPD or DFLASH, "
            "e.g. `specopd serve -c cpu-smollm2`) and evaluate again.")
    finish = meta.get("finish_reason")
    return RequestStats(
        id=str(record["id"]), domain=str(record.get("domain", "")), prompt_tokens=prompt_len,
        completion_tokens=completion, verify_steps=int(meta.get("spec_verify_ct", 0)),
        accept_length=meta.get("spec_accept_length"),
        histogram=tuple(int(n) for n in meta.get("spec_correct_drafts_histogram") or ()),
        finish_reason=finish.get("type") if isinstance(finish, dict) else finish)


def summarize(stats: Sequence[RequestStats], domains: Sequence[str]) -> Dict[str, Any]:
    """Per-domain sums and tau, ``mean_tau`` (unweighted over domains with verify steps) and ``pooled_tau``.

    A domain without verify steps (all replies ended after the prefill token) gets ``tau`` None and is left out
    of ``mean_tau``.
    """
    per_domain: Dict[str, Dict[str, Any]] = {}
    for d in domains:
        rows = [s for s in stats if s.domain == d]
        comp, ver = sum(s.completion_tokens for s in rows), sum(s.verify_steps for s in rows)
        width = max((len(s.histogram) for s in rows), default=0)
        hist = [sum(s.histogram[k] for s in rows if k < len(s.histogram)) for k in range(width)]
        lens = [s.accept_length for s in rows if s.accept_length is not None]
        per_domain[d] = {"tau": comp / ver if ver else None, "requests": len(rows), "completion_tokens": comp,
                         "verify_steps": ver, "mean_request_accept_length": sum(lens) / len(lens) if lens else None,
                         "accepted_drafts_histogram": hist, "histogram_steps": sum(hist)}
    taus = [v["tau"] for v in per_domain.values() if v["tau"] is not None]
    comp = sum(v["completion_tokens"] for v in per_domain.values())
    ver = sum(v["verify_steps"] for v in per_domain.values())
    return {"per_domain": per_domain, "tau": {d: v["tau"] for d, v in per_domain.items()},
            "mean_tau": sum(taus) / len(taus) if taus else None, "pooled_tau": comp / ver if ver else None}


def _load_tokenizer(tokenizer: Any, url: str, api_key: Optional[str]) -> Any:
    if tokenizer is None:  # the server's own tokenizer (a path on the server's machine: this one, usually)
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            r = httpx.get(url.rstrip("/") + "/model_info", headers=headers, timeout=30)
        except httpx.HTTPError as exc:
            raise EvaluationError(f"cannot reach the server at {url}: {exc}") from None
        try:
            r.raise_for_status()
            info = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise EvaluationError(f"cannot ask {url} for its tokenizer ({exc}); pass --tokenizer") from None
        tokenizer = info.get("tokenizer_path") or info.get("model_path")
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(tokenizer))
        except (OSError, ValueError) as exc:
            raise EvaluationError(f"cannot load tokenizer {tokenizer}: {exc} (pass --tokenizer)") from None
    return tokenizer


def evaluate_acceptance(url: str, tokenizer: Any, domains: Sequence[str] = DOMAINS, temperature: float = 0.0,
                        limit: Optional[int] = None, max_new_tokens: int = 128, concurrency: int = 8,
                        api_key: Optional[str] = None, *,
                        records: Optional[Mapping[str, Sequence[Mapping[str, Any]]]] = None,
                        max_prompt_tokens: int = 2048, retries: int = 2, timeout_s: float = 600.0,
                        progress: bool = True) -> Dict[str, Any]:
    """Measure tau per domain on the speculative-decoding server at ``url``.

    Args:
        tokenizer: the target's tokenizer, a path to one, or None (load the one the server reports).
        domains: domain names; their prompts come from :func:`eval_records` unless ``records`` maps each
            domain to its records (tests, custom sets). limit: prompts per domain (None = all).
        max_new_tokens: response budget per request; prompts over ``max_prompt_tokens`` are skipped (counted
            in ``skipped_too_long``). concurrency: requests in flight.

    Returns: ``{"per_domain": {d: {"tau", "requests", "completion_tokens", "verify_steps", ...}}, "tau": {d: tau},
    "mean_tau", "pooled_tau", "temperature", "max_new_tokens", "limit", "server", "skipped_too_long",
    "per_request": [asdict(RequestStats), ...], "wall_s"}``.

    Raises:
        SpecDecodingUnavailableError: the server runs no drafter. EvaluationError: no prompts, server down
            after retries, or it refused a request.
    """
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if concurrency < 1 or max_new_tokens < 2:
        raise ValueError("concurrency must be >= 1 and max_new_tokens >= 2")
    client = SpecOPDClient(url, api_key=api_key, retries=retries, timeout=timeout_s)
    t0 = time.monotonic()
    try:
        tok = _load_tokenizer(tokenizer, url, api_key)
        jobs, skipped = [], {d: 0 for d in domains}
        for d in domains:
            recs = records[d] if records is not None else eval_records(d, limit)
            for rec in (list(recs)[:limit] if limit is not None else recs):
                ids = chat_prompt_ids(tok, rec["messages"])
                if len(ids) > max_prompt_tokens:
                    skipped[d] += 1
                    continue
                jobs.append(({**rec, "domain": d}, ids))
        if not jobs:
            raise EvaluationError(f"no prompts to evaluate for domains {list(domains)} (limit {limit})")
        stats: List[RequestStats] = []
        cols = (TextColumn("[bold]acceptance"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*cols, disable=not progress) as bar, ThreadPoolExecutor(concurrency, "specopd-eval") as pool:
            task = bar.add_task("acceptance", total=len(jobs))

            def one(rec: Mapping[str, Any], ids: List[int]) -> RequestStats:
                params = sampling_params(temperature, max_new_tokens, str(rec["id"]), spool=False)
                resp = client.generate(ids, **params)
                return request_stats(rec, len(ids), resp)

            pending = {pool.submit(one, rec, ids) for rec, ids in jobs}
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in done:
                        stats.append(fut.result())
                        bar.advance(task)
            except BaseException:
                for fut in pending:
                    fut.cancel()
                raise
    except ServerError as exc:
        raise EvaluationError(f"evaluation on {url} failed: {exc}") from exc
    finally:
        client.close()
    result = summarize(stats, domains)
    order = {(rec["domain"], str(rec["id"])): i for i, (rec, _) in enumerate(jobs)}
    stats.sort(key=lambda s: order[(s.domain, s.id)])
    result.update(temperature=float(temperature), max_new_tokens=max_new_tokens, limit=limit, server=url,
                  skipped_too_long=skipped, per_request=[asdict(s) for s in stats],
                  wall_s=round(time.monotonic() - t0, 3))
    return result


def plot_tau(result: Mapping[str, Any], path: str | os.PathLike[str], label: Optional[str] = None) -> Path:
    """Bar plot (PNG, matplotlib Agg) of tau per domain with the mean as a dashed line; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taus = {d: v["tau"] for d, v in result["per_domain"].items() if v["tau"] is not None}
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * max(len(taus), 1), 3.6))
    try:
        bars = ax.bar(list(taus), list(taus.values()), color="#4C72B0")
        ax.bar_label(bars, fmt="%.2f")
        if result.get("mean_tau") is not None:
            ax.axhline(result["mean_tau"], color="k", ls="--", lw=1, label=f"mean {result['mean_tau']:.2f}")
            ax.legend(loc="lower right")
        ax.set_ylabel("tau (tokens / verify step)")
        ax.set_ylim(0, max([1.0, *taus.values()]) * 1.15)
        title = f"T={result.get('temperature', '?')}, {result.get('max_new_tokens', '?')} new tokens"
        ax.set_title(f"{label}: {title}" if label else title)
        fig.tight_layout()
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)
    return out
