"""The report section of a ``benchmarks/concurrency_reference.py`` result (``concurrency_reference_*.json``: per
temperature, the shipped drafter served vs plain serving at each concurrency level). Its format differs from
``specopd bench serve``'s ``concurrency_*.json`` (``levels``), so :mod:`.build` renders each with its own table;
every number is read from the file."""

from __future__ import annotations

from typing import Any, List, Mapping

from sglang_specopd.app.bench.report.sections import _f, _num, _provenance


def is_reference_serving(data: Mapping[str, Any]) -> bool:
    """Whether ``data`` is a concurrency_reference.py result (a ``temperatures`` map of level lists)."""
    return isinstance(data.get("temperatures"), Mapping)


def is_bench_serve(data: Mapping[str, Any]) -> bool:
    """Whether ``data`` is a ``specopd bench serve`` result (a ``levels`` list)."""
    return isinstance(data.get("levels"), list)


def reference_serving_section(name: str, data: Mapping[str, Any], heading: str = "###") -> List[str]:
    """Markdown lines: provenance, one table row per (temperature, concurrency) with both servers' output tokens/s,
    the speedup, tau (mean of the domains, with its interval at each level) and errors; the machine's load."""
    load = data.get("load_average_1m") or {}
    out = [f"{heading} `{name}`", "", f"Produced by {_provenance(data)}.", "",
           f"Drafter `{data.get('drafter', '?')}` (shipped), server config `{data.get('server_config', '?')}`, "
           f"{data.get('limit_per_domain', '?')} held-out prompts per domain, {data.get('max_new_tokens', '?')} new "
           "tokens max.", "",
           "| T | concurrency | SpecOPD tok/s | plain tok/s | speedup | tau [95% interval] | errors (spec / plain) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for key in sorted(data["temperatures"]):
        for lv in data["temperatures"][key]:
            if not isinstance(lv, Mapping) or not _num(lv.get("speedup")):
                continue
            acc, err = lv.get("acceptance") or {}, lv.get("errors") or {}
            ci = acc.get("ci95") or [None, None]
            out.append(f"| {key} | {lv.get('concurrency', '?')} | {_f(lv.get('specopd_tokens_per_s'))} | "
                       f"{_f(lv.get('plain_tokens_per_s'))} | {_f(lv['speedup'])}x | {_f(acc.get('mean'), 3)} "
                       f"[{_f(ci[0], 3)}, {_f(ci[1], 3)}] | {err.get('specopd', '-')} / {err.get('plain', '-')} |")
    if load:
        out += ["", "1-minute load average of the machine during each temperature's run: "
                + ", ".join(f"{k} {_f(v)}" for k, v in sorted(load.items())) + " (2 cores)."]
    return out + [""]
