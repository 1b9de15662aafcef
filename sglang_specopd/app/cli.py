"""The ``specopd`` command line.

Every subcommand imports its heavy dependencies (torch, transformers, sglang) lazily, so ``specopd --help``
and trainer-only hosts stay fast and never load SGLang unless a subcommand needs it.
"""

from __future__ import annotations

from sglang_specopd.app.cli_apps import app, drafter_app, fleet_app, models_app  # noqa: F401  (re-exported)


def _register_subcommands() -> None:
    # Each module adds its commands to the apps above; the modules import nothing heavy at import time.
    from sglang_specopd.app import (cli_adapt, cli_bench, cli_demo, cli_drafter, cli_eval, cli_fleet,  # noqa: F401
                                    cli_models, cli_serve, cli_train)


def main() -> None:
    """Console-script entry point."""
    _register_subcommands()
    app()


if __name__ == "__main__":
    # Under `python -m`, this file is `__main__`; run the canonical module's app so subcommands attach to it.
    from sglang_specopd.app.cli import main as _main

    _main()
