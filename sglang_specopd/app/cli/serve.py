"""``specopd serve``: start SGLang with the plugin from a server config; stop it cleanly on Ctrl-C / SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import List, Optional

import typer

from sglang_specopd.app.cli.apps import app


@app.command("serve")
def serve(
    config: str = typer.Option(..., "--config", "-c", help="Server config: a YAML path or a name in server_configs/."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(30000, "--port"),
    drafter: Optional[str] = typer.Option(None, "--drafter", help="Override the config's drafter directory."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="API key required for generation (SGLang's)."),
    admin_api_key: Optional[str] = typer.Option(None, "--admin-api-key", help="Key for admin routes (drafter swap)."),
    sglang_arg: List[str] = typer.Option([], "--sglang-arg", help="Extra SGLang flag, repeatable: --sglang-arg=--log-level=debug"),
    log_file: Optional[Path] = typer.Option(None, "--log-file", help="SGLang's log (default: a temp file)."),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds to wait for the server to become healthy."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the config without the weights and a GPU, print "
                                                          "the exact SGLang command, start nothing."),
    target_config: Optional[str] = typer.Option(None, "--target-config", help="With --dry-run: a directory with the "
                                                "target's config.json (and tokenizer.json) when the target is not here."),
    drafter_config: Optional[str] = typer.Option(None, "--drafter-config", help="With --dry-run: a directory with "
                                                 "the drafter's config.json when the drafter is not here."),
) -> None:
    """Start a real SGLang server (SPECOPD drafter per the config; SPECOPD_DSPARK for a DSpark drafter) and keep it
    running until interrupted; with --dry-run, only check the config and print the command."""
    from sglang_specopd.app.config import ConfigError, ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer, ServeError
    from sglang_specopd.app.serve.choice import decide_drafter
    from sglang_specopd.app.serve.spec import config_path, launch_spec, serve_target

    if dry_run:
        _dry_run(config, host, port, api_key, admin_api_key, drafter, sglang_arg, target_config, drafter_config)
        return
    try:
        cfg = ServeConfig.load(config_path(config))
        choice = decide_drafter(cfg, serve_target(cfg), override=drafter)  # the command's one drafter decision
        spec = launch_spec(cfg, host=host, port=port, api_key=api_key, admin_api_key=admin_api_key,
                           extra_args=sglang_arg, choice=choice)
    except (ConfigError, ServeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    if cfg.device == "cuda" and not cfg.checked_on_gpu:
        typer.echo(f"note: config {cfg.name!r} has not yet been checked on a GPU", err=True)
    algorithm = f", --speculative-algorithm {spec.speculative_algorithm}" if spec.drafter_path else ""
    typer.echo(f"drafter: {spec.drafter_path or 'none'} ({choice.how}){algorithm}", err=True)
    server = SGLangServer(spec, log_path=log_file)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        typer.echo(f"starting SGLang ({cfg.name}); log: {server.log_path}", err=True)
        server.start(timeout=timeout)
        typer.echo(f"ready: {server.url} (healthy after {server.time_to_healthy_s:.1f} s); Ctrl-C to stop", err=True)
        server.proc.wait()
        typer.echo(f"error: SGLang exited with code {server.proc.returncode}\n{server.log_tail()}", err=True)
        raise typer.Exit(code=1)
    except ServeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    except KeyboardInterrupt:
        typer.echo("stopping SGLang", err=True)
    finally:
        server.stop()


def _dry_run(config, host, port, api_key, admin_api_key, drafter, sglang_arg, target_config, drafter_config) -> None:
    """``--dry-run``: ``ok:`` / ``note:`` / ``error:`` lines on stderr, the command on stdout; exit 2 on an error."""
    from sglang_specopd.app.config import ConfigError, ServeConfig
    from sglang_specopd.app.serve.spec import config_path
    from sglang_specopd.app.serve.dry_run import dry_run

    try:
        cfg = ServeConfig.load(config_path(config))
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    res = dry_run(cfg, host=host, port=port, api_key=api_key, admin_api_key=admin_api_key, drafter=drafter,
                  extra_args=sglang_arg, target_config=target_config, drafter_config=drafter_config)
    for kind, lines in (("ok", res.ok), ("note", res.notes), ("error", res.problems)):
        for line in lines:
            typer.echo(f"{kind}: {line}", err=True)
    typer.echo(res.command)
    if res.problems:
        raise typer.Exit(code=2)
