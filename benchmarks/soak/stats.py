"""Pure statistics of a live-training soak: phase windows, latency percentiles, error tallies, RSS growth, floors.

Times are seconds on one clock (``time.perf_counter()`` minus the soak's origin). A load request belongs to a
phase window when it was sent and finished inside it (requests straddling a boundary count in neither). Error
keys are HTTP status codes as strings (``"503"``) or, for failures without a status, ``"timeout"``,
``"connection"``, ``"stream_cut"``, ``"error_chunk"`` and ``"malformed"``.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from sglang_specopd.app.bench.client import RequestRecord
from sglang_specopd.app.bench.metrics import itl_values, percentile

SOURCES = ("load", "trainer", "fuzzer")
FLOOR_LIMITS = {"itl_p99_ratio": 2.0, "errors_5xx": 0, "rss_growth_fraction": 0.10}

TimedRecord = Tuple[float, RequestRecord]  # (send time on the soak clock, record)


class Tally:
    """Thread-safe counts per source (``load`` / ``trainer`` / ``fuzzer``): requests sent, errors by key (HTTP
    status >= 400 or a failure kind) and malformed responses (do not parse / lack required keys)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: Counter = Counter()
        self.errors: Dict[str, Counter] = {s: Counter() for s in SOURCES}
        self.malformed: Counter = Counter()

    def add(self, source: str, error: Optional[str] = None, malformed: bool = False) -> None:
        """Count one request of ``source``; ``error`` is its error key (None: no error)."""
        with self._lock:
            self.sent[source] += 1
            if error is not None:
                self.errors[source][error] += 1
            if malformed:
                self.malformed[source] += 1

    def snapshot(self) -> Dict[str, Any]:
        """``{"sent": {source: n}, "errors": {source: {key: n}}, "malformed": {source: n}}`` (plain dicts)."""
        with self._lock:
            return {"sent": {s: self.sent[s] for s in SOURCES},
                    "errors": {s: dict(sorted(self.errors[s].items())) for s in SOURCES},
                    "malformed": {s: self.malformed[s] for s in SOURCES}}


def status_key(status: int) -> Optional[str]:
    """The error key of an HTTP status: ``"4xx"``/``"5xx"`` codes as strings, None below 400."""
    return str(int(status)) if int(status) >= 400 else None


def classify_load_error(error: str) -> str:
    """The error key of a failed streaming request (:class:`RequestRecord` ``error`` text of the bench client)."""
    m = re.match(r"HTTP (\d{3})\b", error)
    if m:
        return m.group(1)
    if error.startswith("timeout"):
        return "timeout"
    if error.startswith("stream ended before"):
        return "stream_cut"
    if error.startswith("error chunk"):
        return "error_chunk"
    if error.startswith("malformed stream"):
        return "malformed"
    return "connection"


def load_outcome(rec: RequestRecord) -> Tuple[Optional[str], bool]:
    """(error key or None, malformed) of one load request: a stream that does not parse, or that ends with
    ``[DONE]`` but carried no token at all, is malformed."""
    if not rec.ok:
        key = classify_load_error(rec.error or "")
        return key, key == "malformed"
    return None, rec.completion_tokens < 1


def in_window(timed: Iterable[TimedRecord], start_s: float, end_s: float) -> List[RequestRecord]:
    """The records sent at or after ``start_s`` that finished at or before ``end_s``."""
    return [r for t, r in timed if t >= start_s and t + r.latency_s <= end_s]


def latency_summary(records: Sequence[RequestRecord]) -> Dict[str, Any]:
    """Requests, failures and TTFT / ITL p50 and p99 (seconds; None without values) of the successful ones.

    ITL follows :func:`sglang_specopd.app.bench.metrics.itl_values` (a chunk of n tokens counts n times).
    """
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [v for r in ok for v in itl_values(r)]
    return {"requests": len(records), "failed": len(records) - len(ok),
            "output_tokens": sum(r.completion_tokens for r in ok),
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "itl_p50_s": percentile(itl, 50), "itl_p99_s": percentile(itl, 99)}


def rss_growth_fraction(samples: Sequence[Sequence[float]], start_s: float, end_s: float,
                        warmup_s: float) -> Optional[float]:
    """Growth of the scheduler's RSS over a phase, after a warm-up: ``max / reference - 1``.

    ``samples``: [t_s, mb] pairs in time order. The reference is the last sample at or before ``start_s +
    warmup_s`` (else the first one after it); the maximum is over the samples in ``[start_s + warmup_s, end_s]``
    and the reference. None when no sample lies in the phase after the warm-up (or the reference is not > 0).
    """
    cut = start_s + warmup_s
    before = [mb for t, mb in samples if start_s <= t <= cut]
    after = [mb for t, mb in samples if cut <= t <= end_s]
    if not after:
        return None
    ref = before[-1] if before else after[0]
    if ref <= 0:
        return None
    return max(after + [ref]) / ref - 1.0


def queue_wait_summary(waits: Iterable[Sequence[float]], start_s: float, end_s: float) -> Dict[str, Any]:
    """score_trees queue waits answered in ``[start_s, end_s]``: ``waits`` holds ``(t_s, wait_s, status)`` per
    reply carrying the server's queue-wait header (200s, and 429s of requests that waited). Keys:
    ``score_queue_wait_p50_s`` / ``_p99_s`` / ``_max_s`` (None without replies), ``score_queue_waits`` (how
    many) and ``score_queue_429`` (how many of them were turned away: the wait bound)."""
    inside = [(float(w), int(st)) for t, w, st in waits if start_s <= t <= end_s]
    values = [w for w, _ in inside]
    return {"score_queue_wait_p50_s": percentile(values, 50), "score_queue_wait_p99_s": percentile(values, 99),
            "score_queue_wait_max_s": max(values) if values else None, "score_queue_waits": len(values),
            "score_queue_429": sum(1 for _, st in inside if st == 429)}


def merge_errors(by_source: Mapping[str, Mapping[str, int]]) -> Dict[str, int]:
    """Sum the per-source error tallies into one ``{key: count}`` (keys sorted)."""
    total: Counter = Counter()
    for counts in by_source.values():
        total.update(counts)
    return dict(sorted(total.items()))


def count_5xx(errors: Mapping[str, int]) -> int:
    """How many errors are HTTP 5xx (keys ``"500"``..``"599"``)."""
    return sum(n for k, n in errors.items() if re.fullmatch(r"5\d\d", str(k)))


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    """``num / den``, None when either is None or ``den`` is not > 0."""
    return num / den if num is not None and den is not None and den > 0 else None


def check_floors(itl_p99_ratio: Optional[float], errors_5xx: int, rss_growth: Optional[float],
                 probes_identical: Optional[bool]) -> Dict[str, Dict[str, Any]]:
    """Each floor's value, limit and ``pass`` (a missing measurement fails): ITL p99 training/idle <= 2, no 5xx,
    scheduler RSS growth <= 0.10, greedy probes identical before and after."""
    lim = FLOOR_LIMITS
    return {
        "itl_p99_ratio": {"value": itl_p99_ratio, "limit": f"<= {lim['itl_p99_ratio']:g}",
                          "pass": itl_p99_ratio is not None and itl_p99_ratio <= lim["itl_p99_ratio"]},
        "errors_5xx": {"value": errors_5xx, "limit": "== 0", "pass": errors_5xx == lim["errors_5xx"]},
        "rss_growth_fraction": {"value": rss_growth, "limit": f"<= {lim['rss_growth_fraction']:g}",
                                "pass": rss_growth is not None and rss_growth <= lim["rss_growth_fraction"]},
        "greedy_probes_identical": {"value": probes_identical, "limit": "true", "pass": probes_identical is True},
    }


def assemble_result(*, minutes: float, phases: Mapping[str, Mapping[str, Any]], tally: Mapping[str, Any],
                    rss_mb: Sequence[Sequence[float]], rss_growth: Optional[float], swaps: int,
                    probes_before: Sequence[Sequence[int]], probes_after: Sequence[Sequence[int]],
                    scoring_budget: int, extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The result payload (keys of ``results.md``'s ``live_training_soak_cpu.json`` plus p50s and floors).

    ``phases``: ``{"idle": latency_summary, "training": latency_summary}``; ``tally``: :meth:`Tally.snapshot`;
    ``probes_*``: greedy output ids per probe prompt. Raises KeyError when a phase is missing.
    """
    by_source = {s: dict(tally["errors"].get(s, {})) for s in SOURCES}
    errors = merge_errors(by_source)
    n5xx = count_5xx(errors)
    identical = bool(probes_before) and [list(p) for p in probes_before] == [list(p) for p in probes_after]
    itl_ratio = ratio(phases["training"]["itl_p99_s"], phases["idle"]["itl_p99_s"])
    out: Dict[str, Any] = {
        "minutes": minutes,
        "errors_by_status": errors, "errors_by_source": by_source, "errors_5xx": n5xx,
        "malformed_responses": sum(tally["malformed"].values()), "malformed_by_source": dict(tally["malformed"]),
        "requests_by_source": dict(tally["sent"]),
        "fuzz_examples": int(tally["sent"].get("fuzzer", 0)),
        "swaps": swaps, "scoring_budget": scoring_budget,
        "rss_mb": [[round(t, 1), round(mb, 1)] for t, mb in rss_mb], "rss_growth_fraction": rss_growth,
        "greedy_probes_identical": identical, "itl_p99_ratio": itl_ratio,
    }
    for stat in ("itl_p99_s", "ttft_p99_s", "itl_p50_s", "ttft_p50_s"):
        out[stat] = {name: phases[name][stat] for name in ("idle", "training")}
    out["phases"] = {name: dict(summary) for name, summary in phases.items()}
    if extra:
        out.update(extra)
    out["floors"] = check_floors(itl_ratio, n5xx, rss_growth, identical)
    out["floors_pass"] = all(f["pass"] for f in out["floors"].values())
    return out
