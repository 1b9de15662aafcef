"""``specopd bench serve`` (throughput/latency at concurrency levels, speculative vs plain) and ``specopd bench
report`` (all result files -> one markdown report with plots).

Exit codes: 0 ok; 1 the benchmark failed (server down or of the wrong kind, or a level where a server completed no
request: the result is still written); 2 bad arguments, config or data.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import List, Optional

import typer

from sglang_specopd.app.cli.apps import app

bench_app = typer.Typer(no_args_is_help=True, help="Serving benchmarks and the benchmark report.")
app.add_typer(bench_app, name="bench")


def parse_levels(text: str) -> List[int]:
    """``"1,2,4,8"`` -> ``[1, 2, 4, 8]``; raises ``typer.BadParameter`` for non-integers, values < 1, duplicates."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers like 1,2,4,8, got {text!r}") from None
    if not levels or any(c < 1 for c in levels) or len(set(levels)) != len(levels):
        raise typer.BadParameter(f"concurrency levels must be distinct integers >= 1, got {text!r}")
    return levels


def _fail(msg: str, code: int) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=code)


@bench_app.command("serve")
def serve(
    server: Optional[str] = typer.Option(None, "--server", help="URL of a running speculative server."),
    launch: Optional[str] = typer.Option(None, "--launch", help="Start the speculative server from this config "
                                         "(name in server_configs/ or YAML path) instead of --server."),
    baseline_server: Optional[str] = typer.Option(None, "--baseline-server", help="URL of a running plain server "
                                                  "on the same target."),
    launch_baseline: bool = typer.Option(False, "--launch-baseline", help="Start the plain baseline: the --launch "
                                         "config without its drafter."),
    drafter: Optional[str] = typer.Option(None, "--drafter", help="With --launch: drafter directory (default: the "
                                          "SFT drafter in $SPECOPD_HOME/drafters if present, else the config's)."),
    concurrency: str = typer.Option("1,2,4,8", "--concurrency", help="Comma-separated concurrency levels."),
    domains: str = typer.Option("dialogue,coding,math,agentic", "--domains", help="Comma-separated domains."),
    limit: int = typer.Option(2, "--limit", min=1, help="Held-out prompts per domain (same split as eval)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=2),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos/--stop-at-eos", help="Always generate max-new-tokens."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", min=1.0, help="Seconds per request."),
    max_prompt_tokens: int = typer.Option(2048, "--max-prompt-tokens", min=1),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Target tokenizer: a directory or a prepared "
                                            "name like smollm2 (default: the server's)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="SPECOPD_API_KEY"),
    baseline_api_key: Optional[str] = typer.Option(None, "--baseline-api-key", help="Default: --api-key."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the result JSON here."),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="With --launch: SGLang logs (default: temp)."),
    api: str = typer.Option("completions", "--api", help="Streaming route: completions (/v1/completions) or "
                            "generate (SGLang's /generate: the one to use through sglang-router, whose "
                            "/v1/completions takes no token-id prompt)."),
) -> None:
    """Throughput, TTFT/ITL percentiles and acceptance per concurrency level, speculative vs plain server."""
    from sglang_specopd.app.bench import BenchError
    from sglang_specopd.app.bench.client import RequestParams
    from sglang_specopd.app.bench.runner import BASE, SPEC, load_prompts, run_benchmark
    from sglang_specopd.app.config import ConfigError
    from sglang_specopd.app.launch.process import ServeError
    from sglang_specopd.app.models import TargetNotFoundError, resolve_tokenizer
    from sglang_specopd.app.results import write_result
    from specopd_trainer.data import DataError
    from specopd_trainer.evaluate import EvaluationError, _load_tokenizer

    if (server is None) == (launch is None):
        _fail("give exactly one of --server URL and --launch CONFIG", 2)
    if api not in ("completions", "generate"):
        _fail(f"--api must be completions or generate, got {api!r}", 2)
    if baseline_server is not None and launch_baseline:
        _fail("give at most one of --baseline-server URL and --launch-baseline", 2)
    if launch_baseline and launch is None:
        _fail("--launch-baseline needs --launch CONFIG (it starts that config without its drafter)", 2)
    if drafter is not None and launch is None:
        _fail("--drafter only applies with --launch (a running server already has its drafter)", 2)
    try:
        levels = parse_levels(concurrency)
    except typer.BadParameter as exc:
        _fail(f"--concurrency: {exc}", 2)
    names = [d.strip() for d in domains.split(",") if d.strip()]
    if not names:
        _fail("--domains is empty", 2)
    try:
        tokenizer = resolve_tokenizer(tokenizer)  # a prepared name -> its local directory, never the Hub
    except TargetNotFoundError as exc:
        _fail(f"--tokenizer: {exc}", 2)
    params = RequestParams(max_new_tokens=max_new_tokens, temperature=temperature, ignore_eos=ignore_eos)
    base_key = baseline_api_key or api_key
    code = 0
    try:
        with _servers(launch, server, baseline_server, launch_baseline, drafter, api_key, base_key,
                      log_dir) as (servers, target):
            spec_srv = next(s for s in servers if s.role == SPEC)
            tok = _load_tokenizer(tokenizer or (str(target) if target else None), spec_srv.url, api_key)
            prompts, skipped = load_prompts(tok, names, limit, max_prompt_tokens=max_prompt_tokens)
            typer.echo(f"{len(prompts)} prompts ({', '.join(names)}), levels {levels}, "
                       f"{max_new_tokens} new tokens, T={temperature:g}", err=True)
            payload = run_benchmark(servers, prompts, levels, params, timeout_s=request_timeout,
                                    say=lambda m: typer.echo(m, err=True), api=api)
    except (ConfigError, DataError) as exc:
        _fail(str(exc), 2)
    except (ServeError, BenchError, EvaluationError) as exc:
        _fail(str(exc), 1)
    payload.update(domains=names, limit_per_domain=limit, skipped_too_long=skipped,
                   load_average_1m=os.getloadavg()[0], target=str(target) if target else None)
    for lv in payload["levels"]:
        for role in (SPEC, BASE):
            if role in lv and lv[role]["completed"] == 0:
                typer.echo(f"error: concurrency {lv['concurrency']}: the {role} server completed no request "
                           f"({lv[role]['error_messages'][:1]})", err=True)
                code = 1
    _print_table(payload)
    if out is not None:
        typer.echo(f"wrote {write_result(out, payload)}")
    raise typer.Exit(code=code)


def _servers(launch, server, baseline_server, launch_baseline, drafter, api_key, base_key, log_dir):
    """Context manager yielding ``(servers, target_dir or None)``: launched ones, or the given URLs."""
    import contextlib

    from sglang_specopd.app.bench.runner import BASE, SPEC, BenchServer, launched_servers

    if launch is not None:
        logs = log_dir or Path(tempfile.mkdtemp(prefix="specopd-bench-"))
        cm = launched_servers(launch, drafter=drafter, baseline=launch_baseline, log_dir=logs, api_key=api_key,
                              say=lambda m: typer.echo(m, err=True))
        if baseline_server is None:
            return cm
        return _add_external(cm, BenchServer(BASE, baseline_server, api_key=base_key))

    servers = [BenchServer(SPEC, server, api_key=api_key)]
    if baseline_server is not None:
        servers.append(BenchServer(BASE, baseline_server, api_key=base_key))
    return contextlib.nullcontext((servers, None))


def _add_external(cm, extra):
    import contextlib

    @contextlib.contextmanager
    def wrapped():
        with cm as (servers, target):
            yield servers + [extra], target

    return wrapped()


def _print_table(payload) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="serving benchmark (output tokens/s; times p50)")
    for col in ("concurrency", "specopd tok/s", "plain tok/s", "speedup", "TTFT s", "ITL ms", "tau", "errors"):
        table.add_column(col, justify="right")
    for lv in payload["levels"]:
        s, b, sp = lv.get("specopd", {}), lv.get("baseline") or {}, lv.get("speedup") or {}

        def f(x, d=2, k=1.0):
            return "-" if x is None else f"{x * k:.{d}f}"

        table.add_row(str(lv["concurrency"]), f(s.get("output_tokens_per_s")), f(b.get("output_tokens_per_s")),
                      f(sp.get("output_tokens_per_s")), f"{f(s.get('ttft_p50_s'))} / {f(b.get('ttft_p50_s'))}",
                      f"{f(s.get('itl_p50_s'), 1, 1e3)} / {f(b.get('itl_p50_s'), 1, 1e3)}",
                      f(s.get("mean_acceptance_length"), 3), f"{s.get('errors', '-')} / {b.get('errors', '-')}")
    Console(stderr=True).print(table)


@bench_app.command("report")
def report(
    results: Path = typer.Option(Path("benchmarks/results"), "--results", help="Directory of result JSON files."),
    out: Path = typer.Option(Path("benchmarks/REPORT.md"), "--out", help="Markdown report; PNGs go next to it."),
    readme: Optional[Path] = typer.Option(None, "--readme", help="Also fill this README's generated block."),
) -> None:
    """Collect the result files into one markdown report with plots (missing files are listed as skipped)."""
    from sglang_specopd.app.bench.report.build import build_report

    if not results.is_dir():
        _fail(f"--results {results} is not a directory", 2)
    try:
        res = build_report(results, out, readme)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc), 2)
    typer.echo(f"wrote {res.markdown} ({len(res.included)} result files, {len(res.skipped)} skipped)")
    for p in res.plots:
        typer.echo(f"wrote {p}")
    if readme is not None:
        typer.echo(f"{readme}: {'updated' if res.readme_updated else 'already up to date'}")
