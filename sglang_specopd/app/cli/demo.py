"""``specopd demo``: the embedded default end to end, for a first look.

Prepares SmolLM2-135M-Instruct if needed, starts the SPECOPD server of ``server_configs/cpu-smollm2.yaml``,
sends one chat completion through the OpenAI-compatible API (asking for the acceptance trace), prints the reply
and the acceptance statistics SGLang and the plugin report, and stops the server. Then (unless ``--no-compare``)
it serves the same target without a drafter and sends the same request, and prints both decode rates and the
speedup measured in this run: one prompt, so indicative only (``specopd bench serve`` measures with intervals).

The drafter: ``--drafter`` if given, else the newest drafter ``specopd main`` trained for this target (SpecOPD or
SFT, if one fits), else the random-init default (:func:`sglang_specopd.app.serve.choice.decide_drafter`); the demo
prints which one served and why.
"""

from __future__ import annotations

from typing import Optional

import typer

from sglang_specopd.app.cli.apps import app


@app.command("demo")
def demo(
    config: str = typer.Option("cpu-smollm2", "--config", "-c", help="Server config (name or YAML path)."),
    prompt: str = typer.Option("Write a Python function that checks whether a number is prime.", "--prompt"),
    max_tokens: int = typer.Option(96, "--max-tokens"),
    port: int = typer.Option(0, "--port", help="0 = any free port."),
    drafter: Optional[str] = typer.Option(None, "--drafter", help="Serve this drafter directory (default: the "
                                          "newest drafter `specopd main` trained, else the random-init one)."),
    compare: bool = typer.Option(True, "--compare/--no-compare",
                                 help="Also serve without a drafter and print the speedup measured in this run."),
) -> None:
    """Serve the default target with SPECOPD, send one chat completion, print reply + acceptance stats, stop;
    then the same request without a drafter, and the speedup."""
    from rich.console import Console
    from rich.table import Table

    from sglang_specopd.app.config import ConfigError, ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer, ServeError, free_port
    from sglang_specopd.app.models import ModelsError, prepare_model, resolve_target, KNOWN_MODELS
    from sglang_specopd.app.serve.choice import decide_drafter
    from sglang_specopd.app.serve.spec import config_path, launch_spec

    console = Console(stderr=True)
    try:
        cfg = ServeConfig.load(config_path(config))
        if cfg.target in KNOWN_MODELS:
            prepare_model(cfg.target)
        # the command's one drafter decision (a trained drafter preferred, else the random-init default, which the
        # demo accepts and names in its drafter: line), then the launch with it
        cfg = cfg.model_copy(update={"allow_random_drafter": True})
        choice = decide_drafter(cfg, resolve_target(cfg.target), override=drafter, prefer_trained=True)
        spec = launch_spec(cfg, port=port or free_port(), choice=choice)
    except (ConfigError, ServeError, ModelsError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    typer.echo(f"drafter: {spec.drafter_path or 'none'} ({choice.how})", err=True)  # unwrapped: a copyable path
    with console.status(f"starting SGLang with {cfg.speculative_algorithm or 'no'} drafter ({cfg.name}) ..."):
        try:
            server = SGLangServer(spec).start()
        except ServeError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=1)
    ok = False
    try:
        console.print(f"server healthy after {server.time_to_healthy_s:.1f} s at {server.url}")
        reply, meta, spec_s = timed_chat(server.url, prompt, max_tokens, trace=True)
        typer.echo(f"\nuser: {prompt}\nassistant: {reply['message']['content']}\n")
        table = Table(title="acceptance statistics (this request)")
        table.add_column("metric")
        table.add_column("value", justify="right")
        trace = meta.get("specopd_trace") or []
        rows = [("completion tokens", meta.get("completion_tokens")),
                ("verify steps", meta.get("spec_verify_ct")),
                ("mean acceptance length (tau)", f"{meta.get('spec_accept_length', float('nan')):.3f}"),
                ("accepted drafts histogram", meta.get("spec_correct_drafts_histogram")),
                ("trace records", len(trace))]
        for k, v in rows:
            table.add_row(k, str(v))
        Console().print(table)
        typer.echo(f"served by drafter: {spec.drafter_path or 'none'} ({choice.how})")
        ok = True
    finally:
        server.stop()
        if ok:  # the SGLang log is only worth keeping when something went wrong
            server.log_path.unlink(missing_ok=True)
        typer.echo("server stopped" if ok else f"server stopped; SGLang's log: {server.log_path}", err=True)
    if compare and cfg.speculative_algorithm is not None and spec.drafter_path:
        _compare_with_plain(cfg, port, prompt, max_tokens, reply, meta, spec_s)


def timed_chat(url: str, prompt: str, max_tokens: int, trace: bool = False) -> tuple:
    """One greedy chat completion after a 4-token warm-up request: ``(choice, meta_info, seconds)``, the seconds
    those of the timed request alone (client wall clock, HTTP included). Raises httpx.HTTPStatusError on 4xx/5xx."""
    import time

    import httpx

    body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "return_meta_info": True}
    if trace:
        body["custom_params"] = {"specopd_trace": True}
    httpx.post(url + "/v1/chat/completions", json={**body, "max_tokens": 4}, timeout=600).raise_for_status()
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    seconds = time.perf_counter() - t0
    r.raise_for_status()
    data = r.json()
    choice = data["choices"][0]
    meta = dict(choice.get("meta_info") or {})
    meta.setdefault("completion_tokens", (data.get("usage") or {}).get("completion_tokens"))
    return choice, meta, seconds


def _compare_with_plain(cfg, port: int, prompt: str, max_tokens: int, spec_reply: dict, spec_meta: dict,
                        spec_s: float) -> None:
    """Serve ``cfg``'s target without a drafter, send the same request, print both rates and the speedup."""
    from rich.console import Console
    from rich.table import Table

    from sglang_specopd.app.launch.process import SGLangServer, ServeError, free_port
    from sglang_specopd.app.serve.spec import launch_spec

    plain_cfg = cfg.model_copy(update={"name": f"{cfg.name}-plain", "drafter": None, "speculative_algorithm": None})
    console = Console(stderr=True)
    with console.status(f"starting SGLang without a drafter ({plain_cfg.name}) for the comparison ..."):
        try:
            server = SGLangServer(launch_spec(plain_cfg, port=port or free_port())).start()
        except ServeError as exc:
            typer.echo(f"comparison skipped: the plain server did not start: {exc}", err=True)
            return
    try:
        reply, meta, plain_s = timed_chat(server.url, prompt, max_tokens)
    finally:
        server.stop()
        server.log_path.unlink(missing_ok=True)
    spec_tokens, plain_tokens = spec_meta.get("completion_tokens") or 0, meta.get("completion_tokens") or 0
    spec_rate, plain_rate = spec_tokens / spec_s, plain_tokens / plain_s
    table = Table(title="speculative vs plain serving (this run, this prompt)")
    for col in ("server", "completion tokens", "seconds", "tokens/s"):
        table.add_column(col, justify="right" if col != "server" else "left")
    table.add_row(f"{cfg.speculative_algorithm} + drafter", str(spec_tokens), f"{spec_s:.2f}", f"{spec_rate:.1f}")
    table.add_row("plain (no drafter)", str(plain_tokens), f"{plain_s:.2f}", f"{plain_rate:.1f}")
    Console().print(table)
    same = spec_reply["message"]["content"] == reply["message"]["content"]
    typer.echo(f"speedup vs plain serving: {spec_rate / plain_rate:.2f}x (one request at concurrency 1; "
               f"replies {'identical' if same else 'differ (bf16 rounding can flip a near-tie)'}; "
               f"`specopd bench serve` measures with intervals)")
