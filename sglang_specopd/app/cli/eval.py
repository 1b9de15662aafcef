"""``specopd eval acceptance``: acceptance length per domain on a server that is already running.

Prints a table, and optionally writes the result JSON (shared result shape, :func:`results.write_result`) and a
bar plot of tau per domain. Exit codes: 0 ok, 1 the server failed or runs no drafter, 2 bad arguments or data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from sglang_specopd.app.cli.apps import app

eval_app = typer.Typer(no_args_is_help=True, help="Evaluate drafters against a running server.")
app.add_typer(eval_app, name="eval")


@eval_app.command("acceptance")
def acceptance(
    server: str = typer.Option(..., "--server", help="URL of a running speculative-decoding server."),
    domains: str = typer.Option("dialogue,coding,math,agentic", "--domains", help="Comma-separated domains."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy, 1 = sampling."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Held-out prompts per domain (default all)."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", min=2),
    concurrency: int = typer.Option(8, "--concurrency", min=1),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the result JSON here."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG bar plot of tau per domain here."),
    label: Optional[str] = typer.Option(None, "--label", help="Name of this drafter/run, stored and plotted."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Target tokenizer dir or prepared "
                                            "name like smollm2 (default: server's)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="SPECOPD_API_KEY"),
) -> None:
    """Mean acceptance length (tau = completion tokens / verify steps) per domain on held-out prompts."""
    from rich.console import Console
    from rich.table import Table

    from sglang_specopd.app.models import TargetNotFoundError, resolve_tokenizer
    from sglang_specopd.app.results import write_result
    from specopd_trainer.data import DataError
    from specopd_trainer.evaluate import EvaluationError, SpecDecodingUnavailableError, evaluate_acceptance, plot_tau

    names = [d.strip() for d in domains.split(",") if d.strip()]
    if not names:
        typer.echo("error: --domains is empty", err=True)
        raise typer.Exit(code=2)
    try:
        tokenizer = resolve_tokenizer(tokenizer)  # a prepared name -> its local directory, never the Hub
    except TargetNotFoundError as exc:
        typer.echo(f"error: --tokenizer: {exc}", err=True)
        raise typer.Exit(code=2)
    try:
        result = evaluate_acceptance(server, tokenizer, names, temperature, limit, max_new_tokens, concurrency,
                                     api_key=api_key)
    except SpecDecodingUnavailableError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1)
    except DataError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    except EvaluationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1)
    result["label"] = label
    table = Table(title=f"acceptance length{f' ({label})' if label else ''}, T={temperature:g}")
    for col in ("domain", "requests", "skipped (too long)", "completion tokens", "verify steps", "tau"):
        table.add_column(col, justify="left" if col == "domain" else "right")
    for d, v in result["per_domain"].items():
        tau = "-" if v["tau"] is None else f"{v['tau']:.3f}"
        table.add_row(d, str(v["requests"]), str(result["skipped_too_long"].get(d, 0)), str(v["completion_tokens"]),
                      str(v["verify_steps"]), tau)
    mean = result["mean_tau"]
    table.add_row("mean", "", "", "", "", "-" if mean is None else f"{mean:.3f}")
    Console().print(table)
    if out is not None:
        typer.echo(f"wrote {write_result(out, result)}")
    if plot is not None:
        typer.echo(f"wrote {plot_tau(result, plot, label)}")
