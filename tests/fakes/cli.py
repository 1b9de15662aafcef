"""Running the ``specopd`` CLI in-process (typer's CliRunner) as the CLI tests do: :func:`specopd_cli` (any
subcommand, wide terminal, no keys from the environment), :func:`train_cli` (``specopd train ...``),
:func:`one_error_line` (a refusal is one ``error:`` line on stderr) and :func:`metric_rows` (a run's metrics.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List


def specopd_cli(*args: str):
    """``specopd ARGS``; asserts no traceback in the output."""
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    res = CliRunner().invoke(app, list(args), env={"SPECOPD_ADMIN_KEY": None, "SPECOPD_API_KEY": None,
                                                   "COLUMNS": "240", "TERMINAL_WIDTH": "240"})
    assert "Traceback" not in res.output, res.output
    return res


def train_cli(*args: str):
    """``specopd train ARGS`` (default terminal width); asserts no traceback in the output."""
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    res = CliRunner().invoke(app, ["train", *args], env={"SPECOPD_ADMIN_KEY": None, "SPECOPD_API_KEY": None})
    assert "Traceback" not in res.output, res.output
    return res


def metric_rows(run: Path) -> List[dict]:
    """The rows of ``run/metrics.jsonl``."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def one_error_line(res, code: int = 2) -> str:
    assert res.exit_code == code, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]
