"""The plugin's Prometheus series: one table (name, type, labels, help, the process that records it).

Named in SGLang's style (a ``namespace:`` prefix, SGLang's own series are ``sglang:*``; the plugin's are
``specopd:*`` so that they never collide with a future SGLang series) with SGLang's ``model_name`` label on every
series, and cumulative like vLLM's spec-decode counters (``vllm:spec_decode_num_*``): rates, mean acceptance and
per-position acceptance come from PromQL (``rate(accepted) / rate(drafts)``), unlike SGLang's windowed
``sglang:spec_accept_length`` / ``sglang:spec_accept_rate`` gauges, which reset every log interval.

prometheus-client appends ``_total`` to a counter's name in the exposition (``specopd:spec_decode_num_drafts`` is
scraped as ``specopd:spec_decode_num_drafts_total``); :func:`exposed` gives that name. Pure data: importing this
module imports nothing (prometheus_client must be imported only after SGLang set ``PROMETHEUS_MULTIPROC_DIR``).
docs/metrics.md describes every series with example PromQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

PREFIX = "specopd:"
MODEL_LABEL = "model_name"
# Seconds a score_trees request waited in the line for its turn (X-SpecOPD-Queue-Wait-S).
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class Series:
    """One series. ``kind``: counter | gauge | histogram; ``labels``: beyond ``model_name``; ``process``:
    scheduler | http (SGLang's HTTP server / tokenizer-manager process) | adapter (``specopd adapt --metrics-port``);
    ``mode``: a gauge's prometheus-client ``multiprocess_mode`` (SGLang's gauges use ``mostrecent``)."""

    name: str
    kind: str
    help: str
    labels: Tuple[str, ...] = ()
    process: str = "scheduler"
    mode: str = "mostrecent"
    buckets: Tuple[float, ...] = ()


def _s(name: str, kind: str, help: str, labels=(), process="scheduler", **kw) -> Series:
    return Series(PREFIX + name, kind, help, tuple(labels), process, **kw)


SERVER_SERIES: Tuple[Series, ...] = (
    # --- speculative decoding (the SPECOPD / SPECOPD_DSPARK worker, per verify step) ---
    _s("spec_decode_num_drafts", "counter", "Drafts verified: one per request per verify step that verified at "
       "least one drafted token (a goodput k = 0 step verifies none)."),
    _s("spec_decode_num_draft_tokens", "counter", "Drafted tokens the target verified (block_size - 1 per draft, "
       "or the goodput policy's k)."),
    _s("spec_decode_num_accepted_tokens", "counter", "Drafted tokens the target accepted (the bonus token is not "
       "counted: tokens per step = 1 + accepted / drafts)."),
    _s("spec_decode_num_accepted_tokens_per_pos", "counter", "Drafts whose drafted token at this position "
       "(1 = the first after the anchor) was accepted.", ("position",)),
    _s("spec_policy_k", "counter", "Decode steps of the goodput policy by k, the number of drafts it verified "
       "(0 = a plain decode step).", ("k",)),
    # --- the serving drafter (hot swap, two-phase rollout) ---
    _s("drafter_info", "gauge", "1 for the version of the serving drafter, 0 for versions it served before.",
       ("version",)),
    _s("drafter_ops", "counter", "Drafter operations: swap (one-phase hot swap), stage / commit / abort / expire "
       "(two-phase rollout), by outcome ok | refused (4xx) | error (5xx).", ("op", "outcome")),
    # --- live traffic ---
    _s("traffic_spool_bytes", "gauge", "Bytes held in the live-traffic spool."),
    # --- score_trees (HTTP process: the line in front of the scheduler) ---
    _s("score_trees_requests", "counter", "POST /specopd/score_trees requests received.", process="http"),
    _s("score_trees_refusals", "counter", "score_trees requests refused, by HTTP status (429: the line is full or "
       "the wait would exceed score_trees_queue_wait_s; 413: over the payload or cost limits; 400 / 401 / 403 / "
       "408).", ("code",), process="http"),
    _s("score_trees_queue_depth", "gauge", "score_trees requests in the line (waiting plus the one being scored), "
       "sampled when a request arrives and when one is answered.", process="http"),
    _s("score_trees_queue_wait_seconds", "histogram", "Seconds a score_trees request waited in the line for its "
       "turn (requests that reached their turn, or were refused at it).", process="http", buckets=WAIT_BUCKETS),
)

ADAPTER_SERIES: Tuple[Series, ...] = (
    _s("adapt_pushes", "counter", "Candidate drafters the adapter pushed into the server (or fleet).",
       process="adapter"),
    _s("adapt_push_errors", "counter", "Pushes the server refused or that failed.", process="adapter"),
    _s("adapt_rollbacks", "counter", "Rollbacks: the previous drafter pushed back because the deployed one "
       "measured worse.", process="adapter"),
    _s("adapt_guard_verdicts", "counter", "Guard verdicts by kind (candidate: candidate vs deployed; "
       "deployed_vs_previous: the rollback check) and outcome (deploy | hold).", ("kind", "outcome"),
       process="adapter"),
    _s("adapt_train_steps", "counter", "Optimiser steps of the adapter.", process="adapter"),
    _s("adapt_seconds_since_last_verdict", "gauge", "Seconds since the adapter's last guard verdict (since it "
       "started, before the first).", process="adapter"),
    _s("adapt_last_verdict_timestamp_seconds", "gauge", "Unix time of the last guard verdict (0: none yet).",
       process="adapter"),
)

ALL_SERIES: Tuple[Series, ...] = SERVER_SERIES + ADAPTER_SERIES


def exposed(series: Series) -> str:
    """The name a scrape shows (counters end in ``_total``; a histogram's samples add ``_bucket`` etc.)."""
    return series.name + "_total" if series.kind == "counter" else series.name


def by_name(name: str) -> Series:
    """The series ``name`` (with or without the prefix / ``_total``). KeyError for an unknown one."""
    for s in ALL_SERIES:
        if name in (s.name, exposed(s), s.name[len(PREFIX):], exposed(s)[len(PREFIX):]):
            return s
    raise KeyError(name)
