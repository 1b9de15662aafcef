"""Shared pieces of ``specopd train``: the option factories, the clean-failure exception and its guard, and small
output helpers.

Nothing heavy is imported here at import time (``specopd --help`` stays fast); the guard imports the error types
it maps inside the call. Errors print ``error: ...`` on stderr and exit non-zero, never a traceback:
1 = the server failed or refused (unreachable, API/admin key refused, push refused),
2 = bad arguments or data (missing files, unknown domain or loss, drafter that does not fit).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Mapping

import typer

ADMIN_KEY_ENV = "SPECOPD_ADMIN_KEY"


class _TrainFail(Exception):
    """A clean failure of ``specopd train``: message and exit code."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def _config(factory, flags: Mapping[str, str], options: Mapping[str, Any]):
    """``factory(**options)`` (a strict pydantic config or a function building one), a validation error turned into a
    clean one-line failure (exit 2) naming the CLI flags: ``flags`` maps a config field to its flag (default
    ``--field-name``)."""
    from pydantic import ValidationError

    try:
        return factory(**options)
    except ValidationError as exc:
        raise _TrainFail("; ".join(_describe(e, flags) for e in exc.errors())) from None


def _describe(error: dict, flags: Mapping[str, str]) -> str:
    msg = str(error.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    for name, flag in flags.items():  # snake_case field names in a message become their flags
        if "_" in name:
            msg = re.sub(rf"\b{re.escape(name)}\b", flag, msg)
    loc = error.get("loc") or ()
    if not loc:
        return msg
    field = str(loc[0])
    return f"bad option {flags.get(field) or '--' + field.replace('_', '-')}: {msg}"


def _o_server():
    return typer.Option(None, "--server", help="URL of a running SPECOPD server (`specopd serve ...`); for a fleet "
                                               "pass --router, --workers or --fleet-run-dir instead.")


def _o_workers():
    return typer.Option(None, "--workers", help="A fleet: the SPECOPD workers' URLs, comma-separated (score_trees, "
                                                "spools and pushes go to them; docs/fleet.md).")


def _o_router():
    return typer.Option(None, "--router", help="A fleet's sglang-router URL: generation goes through it; alone, the "
                                               "workers are the ones it lists (GET /workers).")


def _o_fleet_run_dir():
    return typer.Option(None, "--fleet-run-dir", help="A fleet started by `specopd fleet start`: its run directory "
                                                      "(fleet.json gives the workers and the router).")


SERVER_NAMES = ("server", "workers", "router", "fleet_run_dir")


def server_parameters() -> list:
    """The command parameters naming the server(s), in :data:`SERVER_NAMES` order (one server or a fleet:
    :func:`sglang_specopd.app.train.fleet_session.resolve_endpoints`)."""
    import inspect
    from typing import Optional

    kw = inspect.Parameter.KEYWORD_ONLY
    return [inspect.Parameter(name, kw, annotation=Optional[Path] if name == "fleet_run_dir" else Optional[str],
                              default=factory())
            for name, factory in zip(SERVER_NAMES, (_o_server, _o_workers, _o_router, _o_fleet_run_dir))]


def _o_admin_key():
    return typer.Option(None, "--admin-key", envvar=ADMIN_KEY_ENV, show_envvar=True,
                        help="The server's --admin-api-key: needed to push the drafter hot into the server.")


def _o_api_key():
    return typer.Option(None, "--api-key", envvar="SPECOPD_API_KEY", help="The server's --api-key, if it has one.")


def _o_device():
    return typer.Option(None, "--device", help="Where the drafter and the target's embedding + LM head live and "
                                               "train: cuda or cpu (default: cuda when available).")


def _o_dtype():
    return typer.Option(None, "--dtype", help="Their dtype: bfloat16 (default on cuda), float32 (default on cpu) or "
                                              "float16.")


_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32",
           "float16": "float16", "fp16": "float16"}


def resolve_device_dtype(device, dtype, cuda_available=None):
    """``(device, torch dtype)`` of ``--device`` / ``--dtype``: cuda when available (else cpu); bfloat16 on cuda,
    float32 on cpu. Raises :class:`_TrainFail` (exit 2) for another device, ``cuda`` where there is no CUDA device,
    or an unknown dtype."""
    import torch

    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    name = (device or ("cuda" if cuda_available else "cpu")).strip().lower()
    base = name.split(":")[0]
    if base not in ("cuda", "cpu"):
        raise _TrainFail(f"bad option --device: {device!r} (cuda, cuda:N or cpu)")
    if base == "cuda" and not cuda_available:
        raise _TrainFail(f"--device {name}: no CUDA device is available here (torch.cuda.is_available() is False); "
                         "use --device cpu")
    if dtype is not None and dtype.strip().lower() not in _DTYPES:
        raise _TrainFail(f"bad option --dtype: {dtype!r} (bfloat16, float32 or float16)")
    chosen = _DTYPES[dtype.strip().lower()] if dtype else ("bfloat16" if base == "cuda" else "float32")
    return name, getattr(torch, chosen)


def _o_init():
    return typer.Option(None, "--init", help="Drafter checkpoint to start from (default: the drafter the server "
                                             "was started with, as GET /specopd/drafter reports it).")


def _o_target():
    return typer.Option(None, "--target", help="Target checkpoint dir or prepared name, for the tokenizer and the "
                                               "frozen LM head (default: the server's model_path).")


def _o_data():
    return typer.Option("dialogue,coding,math,agentic", "--data",
                        help="A directory holding responses.jsonl + features/ (as `prepare_sequences` writes), or "
                             "a comma list of domains (dialogue,coding,math,agentic): target responses are then "
                             "regenerated by the server and their features fetched through it, cached in "
                             "RUN_DIR/data (resumable).")


def _o_run_dir(method: str):
    return typer.Option(Path(f"runs/{method}"), "--run-dir",
                        help="Checkpoints, metrics.jsonl and the final drafter; an existing run resumes.")


def _o_steps(default: int):
    return typer.Option(default, "--steps", min=1, help="Total optimiser steps (a resumed run continues to it).")


def _o_max_minutes():
    return typer.Option(None, "--max-minutes", min=0.01, help="Stop after this much training time (resumable).")


def _o_seed():
    return typer.Option(0, "--seed", help="Seed of the per-step RNG (anchors, branches, sequences).")


def _o_per_domain():
    return typer.Option(60, "--per-domain", min=1, help="Training prompts per domain (with a domain list).")


def _o_max_new_tokens():
    return typer.Option(160, "--max-new-tokens", min=2, help="Target response length (with a domain list).")


def _o_version_prefix():
    return typer.Option(None, "--version-prefix", help="Pushed versions are PREFIX-step<N> "
                                                       "(default: <method>-<run dir name>).")


def _o_progress():
    return typer.Option(True, "--progress/--no-progress", help="Progress bars.")


def _guarded(body: Callable[[], None]) -> None:
    """Run a command body; known failures become one ``error:`` line and a non-zero exit."""
    from sglang_specopd.wire.drafters.format import DrafterFormatError
    from sglang_specopd.app.models import TargetNotFoundError
    from specopd_trainer.algorithms.registry import AlgorithmError, UnknownAlgorithmError
    from specopd_trainer.checkpoint import CheckpointError
    from specopd_trainer.client.http import ServerError
    from specopd_trainer.collect import CacheFormatError, CollectionError, InvalidRecordError
    from specopd_trainer.data import DataError
    from specopd_trainer.drafters.dflash import DrafterLoadError
    from specopd_trainer.drafters.target_head import TargetHeadError

    try:
        body()
    except _TrainFail as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=exc.code)
    except (ServerError, CollectionError, AlgorithmError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1)
    except (DataError, CacheFormatError, InvalidRecordError, CheckpointError, DrafterFormatError, DrafterLoadError,
            TargetHeadError, TargetNotFoundError, UnknownAlgorithmError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)


def _fmt(x, nd: int = 4) -> str:
    """A value for a summary table (:func:`specopd_trainer.algorithms.registry.fmt`)."""
    from specopd_trainer.algorithms.registry import fmt

    return fmt(x, nd)


def _sayer(rank: int):
    def say(msg: str) -> None:
        if rank == 0:
            typer.echo(msg, err=True)

    return say
