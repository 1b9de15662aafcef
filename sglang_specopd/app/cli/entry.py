"""The ``specopd`` command line.

Every subcommand imports its heavy dependencies (torch, transformers, sglang) lazily, so ``specopd --help``
and trainer-only hosts stay fast and never load SGLang unless a subcommand needs it.
"""

from __future__ import annotations

from sglang_specopd.app.cli.apps import app, drafter_app, fleet_app, models_app  # noqa: F401  (re-exported)


def _register_subcommands() -> None:
    # Each module adds its commands to the apps above; the modules import nothing heavy at import time.
    from sglang_specopd.app.cli import (adapt, bench, demo, drafter, eval, fleet, models, serve,  # noqa: F401
                                        train)


def main() -> None:
    """Console-script entry point."""
    _register_subcommands()
    app()
