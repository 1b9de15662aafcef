"""Serving benchmarks: throughput and latency at concurrency levels, speculative vs autoregressive, one report.

- :mod:`~sglang_specopd.app.bench.client`: one streaming OpenAI-API request -> one :class:`RequestRecord`; one
  concurrency level -> many (asyncio, httpx).
- :mod:`~sglang_specopd.app.bench.metrics`: per-level summaries (tokens/s, requests/s, TTFT/ITL/TPOT percentiles,
  acceptance length and histogram) from the raw records, SGLang ``bench_serving`` conventions.
- :mod:`~sglang_specopd.app.bench.runner`: held-out prompts, warm-up, cache flush, the levels against both servers,
  servers launched from a config when asked.
- :mod:`~sglang_specopd.app.bench.report.build`: every result file in ``benchmarks/results/`` -> ``benchmarks/REPORT.md``
  + PNG plots (+ the table in the README between markers).

Used by ``specopd bench serve`` and ``specopd bench report`` (``sglang_specopd/app/cli/bench.py``).
"""

from __future__ import annotations


class BenchError(RuntimeError):
    """The benchmark cannot run or cannot give meaningful numbers (server down, wrong kind of server, no prompts)."""
