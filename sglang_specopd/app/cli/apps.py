"""The Typer applications of the ``specopd`` command line, which the subcommand modules attach their commands to.

Kept apart from :mod:`sglang_specopd.app.cli.entry` (which imports every subcommand module) so imports point one way.
"""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Train and serve DFlash-family drafters on SGLang.")
models_app = typer.Typer(no_args_is_help=True, help="Prepare target models (offline).")
drafter_app = typer.Typer(no_args_is_help=True, help="Create and validate DFlash drafter checkpoints.")
fleet_app = typer.Typer(no_args_is_help=True, help="N SPECOPD workers behind sglang-router: start, status, stop.")
app.add_typer(models_app, name="models")
app.add_typer(drafter_app, name="drafter")
app.add_typer(fleet_app, name="fleet")
