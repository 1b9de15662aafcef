"""The command-line frame the comparison scripts share (``draft_opd_smollm2.py``, ``drafter_archs_smollm2.py``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any, Callable, Sequence, Tuple, Type


class CompareError(ValueError):
    """A bad option of a comparison script (one line for the user)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (``<prog>: <reason>`` on stderr, exit 2); ``prog`` is the script's name."""

    def error(self, message):
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def require_at_least(args, minimum: int, *names: str) -> None:
    """Raise :class:`CompareError` (``--opt-name must be >= minimum, got V``) for the first option of ``names``
    (argparse dests) whose value is below ``minimum``."""
    for name in names:
        if getattr(args, name) < minimum:
            raise CompareError(f"--{name.replace('_', '-')} must be >= {minimum}, got {getattr(args, name)}")


def script_main(name: str, argv: Sequence[str] | None, parse_args: Callable[[list], Any],
                check_options: Callable[[Any], list], run: Callable[[Any, list], int],
                errors: Tuple[Type[BaseException], ...]) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``; a malformed command line exits 2 with one line), record the
    command as ``args.command`` (``python benchmarks/<name>.py ...``, kept in the result file), check the options
    and run. An exception of ``errors`` (bad options, a changed setup, a server that would not start) prints one
    line ``<name>: <reason>`` to stderr and returns 2; otherwise returns what ``run(args, selected)`` returns."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.command = f"python benchmarks/{name}.py " + shlex.join(argv)
    try:
        return run(args, check_options(args))
    except errors as exc:
        print(f"{name}: {exc}".replace("\n", " "), file=sys.stderr)
        return 2
