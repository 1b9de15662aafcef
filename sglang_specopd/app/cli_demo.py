"""``specopd demo``: the embedded default end to end, for a first look.

Prepares SmolLM2-135M-Instruct if needed, starts the SPECOPD server of ``server_configs/cpu-smollm2.yaml``,
sends one chat completion through the OpenAI-compatible API (asking for the acceptance trace), prints the reply
and the acceptance statistics SGLang and the plugin report, and stops the server.

The drafter: ``--drafter`` if given, else the newest drafter ``specopd main`` trained for this target (SpecOPD or
SFT, if one fits), else the random-init default (:func:`sglang_specopd.app.serve.choose_drafter`); the demo
prints which one served and why.
"""

from __future__ import annotations

from typing import Optional

import typer

from sglang_specopd.app.cli_apps import app


@app.command("demo")
def demo(
    config: str = typer.Option("cpu-smollm2", "--config", "-c", help="Server config (name or YAML path)."),
    prompt: str = typer.Option("Write a Python function that checks whether a number is prime.", "--prompt"),
    max_tokens: int = typer.Option(96, "--max-tokens"),
    port: int = typer.Option(0, "--port", help="0 = any free port."),
    drafter: Optional[str] = typer.Option(None, "--drafter", help="Serve this drafter directory (default: the "
                                          "newest drafter `specopd main` trained, else the random-init one)."),
) -> None:
    """Serve the default target with SPECOPD, send one chat completion, print reply + acceptance stats, stop."""
    import httpx
    from rich.console import Console
    from rich.table import Table

    from sglang_specopd.app.config import ConfigError, ServeConfig
    from sglang_specopd.app.launch import SGLangServer, ServeError, free_port
    from sglang_specopd.app.models import ModelsError, prepare_model, resolve_target, KNOWN_MODELS
    from sglang_specopd.app.serve import DEFAULT_HOW, choose_drafter, config_path, launch_spec

    console = Console(stderr=True)
    try:
        cfg = ServeConfig.load(config_path(config))
        if cfg.target in KNOWN_MODELS:
            prepare_model(cfg.target)
        choice = choose_drafter(cfg, resolve_target(cfg.target), override=drafter, prefer_trained=True)
        chosen = None if choice.path is None or choice.how == DEFAULT_HOW else str(choice.path)
        spec = launch_spec(cfg, port=port or free_port(), drafter=chosen)
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
        body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": 0, "return_meta_info": True, "custom_params": {"specopd_trace": True}}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        reply = r.json()["choices"][0]
        meta = reply.get("meta_info") or {}
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
