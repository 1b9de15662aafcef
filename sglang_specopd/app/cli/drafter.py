"""``specopd drafter ...`` commands: init, check, push (attached to :data:`sglang_specopd.app.cli.apps.drafter_app`).

Errors print ``error: ...`` lines (one per problem for ``check``) on stderr and exit with code 2, never a traceback.
``--arch`` (default ``dflash``) offers the drafter architectures registered in
:mod:`sglang_specopd.wire.drafters.archs` when this module is imported.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Optional

import typer

from sglang_specopd.app.cli.apps import drafter_app
from sglang_specopd.wire.drafters.archs import drafter_arch_names


class _DType(str, enum.Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


# The registered architectures, as choices (an Enum is how Typer shows and checks choices).
_Arch = enum.Enum("_Arch", {name: name for name in drafter_arch_names()}, type=str)  # type: ignore[misc]
_ARCH_HELP = "Drafter architecture (a registered name)."


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _report_problems(problems, drafter: Path) -> None:
    """One ``error: ...`` line per problem (stderr), a count line if there are several; exit 2."""
    for p in problems:
        typer.echo(f"error: {p.message}", err=True)
    if len(problems) > 1:
        typer.echo(f"error: {len(problems)} problems in {drafter}", err=True)
    raise typer.Exit(code=2)


def _resolve(target: str, home: Optional[Path]) -> Path:
    from sglang_specopd.app.models import TargetNotFoundError, resolve_target

    try:
        return resolve_target(target, home=home)
    except TargetNotFoundError as exc:
        _fail(str(exc))
        raise  # unreachable: _fail raises


@drafter_app.command("init")
def init(
    target: str = typer.Option(..., "--target", help="Target: a prepared model name (smollm2) or a HF checkpoint dir."),
    out: Path = typer.Option(..., "--out", help="Output directory of the new drafter."),
    block_size: int = typer.Option(8, "--block-size", help="Verify block size B: the anchor + B-1 drafted tokens, "
                                                            ">= 2 (DSpark: gamma = B-1)."),
    num_layers: int = typer.Option(2, "--num-layers", help="Number of draft transformer layers."),
    seed: int = typer.Option(0, "--seed", help="Weight seed (equal seeds give identical weights)."),
    mask_token: Optional[str] = typer.Option(None, "--mask-token", help="Override the mask token (an existing token)."),
    layer_ids: Optional[str] = typer.Option(None, "--target-layer-ids",
                                            help="Comma-separated target layer ids (default: spread over 1..N-3)."),
    dtype: _DType = typer.Option(_DType.float32, "--dtype", help="Weight dtype."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
    home: Optional[Path] = typer.Option(None, "--home", help="specopd home for resolving model names."),
    arch: _Arch = typer.Option(_Arch("dflash"), "--arch", help=_ARCH_HELP),
    option: Optional[list[str]] = typer.Option(None, "--option", help="Architecture setting KEY=VALUE (repeatable); "
                                               "dflash2: conv_kernel_size, conv_group_size, selector_rank, "
                                               "selector_top_k, output_multiplier, final_logit_softcapping; dspark: "
                                               "markov_rank, markov_head_type, confidence_head_with_markov, "
                                               "sample_from_anchor."),
) -> None:
    """Create a randomly initialised drafter (DFlash by default) for TARGET, check it, and print its directory last."""
    from sglang_specopd.wire.checkpoint_info import TargetConfigError
    from sglang_specopd.app.drafters.check import check_drafter, describe
    from sglang_specopd.wire.drafters.archs import UnknownDrafterArchError
    from sglang_specopd.wire.drafters.format import DrafterFormatError
    from sglang_specopd.wire.drafters.init import DrafterInitError, init_drafter

    target_dir = _resolve(target, home)
    ids = None
    if layer_ids is not None:
        try:
            ids = [int(x) for x in layer_ids.split(",") if x.strip()]
        except ValueError:
            _fail(f"--target-layer-ids must be comma-separated integers, got {layer_ids!r}")
    options = {}
    for item in option or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _fail(f"--option must be KEY=VALUE, got {item!r}")
        options[key.strip()] = value
    try:
        spec = init_drafter(target_dir, out, block_size=block_size, num_layers=num_layers, seed=seed,
                            mask_token=mask_token, target_layer_ids=ids, dtype=dtype.value, overwrite=force,
                            arch=arch.value, options=options)
    except (DrafterFormatError, DrafterInitError, TargetConfigError, UnknownDrafterArchError) as exc:
        _fail(str(exc))
    problems = check_drafter(out, target_dir, arch.value)
    if problems:  # a bug in init itself: report it the same way as `check`
        _report_problems(problems, out)
    typer.echo(f"ok: {describe(spec)}", err=True)
    typer.echo(str(out))


@drafter_app.command("check")
def check(
    drafter: Path = typer.Argument(..., help="Drafter checkpoint directory (any published layout)."),
    target: str = typer.Option(..., "--target", help="Target: a prepared model name (smollm2) or a HF checkpoint dir."),
    home: Optional[Path] = typer.Option(None, "--home", help="specopd home for resolving model names."),
    arch: _Arch = typer.Option(_Arch("dflash"), "--arch", help=_ARCH_HELP),
) -> None:
    """Validate DRAFTER (an ARCH drafter) against TARGET as SGLang 0.5.23 reads it: exit 0 with an "ok: ..."
    summary and one "sglang: ..." line per value SGLang will use (block size, target layer ids, mask token and its
    id, where each comes from) plus SGLang's warnings ("note: ..."), or exit 2, one "error: ..." per problem
    (SGLang's own message for what SGLang refuses)."""
    from sglang_specopd.app.drafters.check import check_drafter_report, describe

    target_dir = _resolve(target, home)
    report = check_drafter_report(drafter, target_dir, arch.value)
    if report.problems:
        _report_problems(report.problems, drafter)
    typer.echo(f"ok: {drafter}: {describe(report.spec)}")
    for key, value in report.used.items():
        typer.echo(f"sglang: {key} {value}")
    for note in report.notes:
        typer.echo(f"note: {note}")


@drafter_app.command("push")
def push(
    drafter: Path = typer.Argument(..., help="Drafter checkpoint directory (any published layout)."),
    server: str = typer.Option(..., "--server", help="URL of the running specopd server, e.g. http://127.0.0.1:30000."),
    admin_key: str = typer.Option(..., "--admin-key", envvar="SPECOPD_ADMIN_KEY",
                                  help="The server's --admin-api-key (or $SPECOPD_ADMIN_KEY)."),
    version: Optional[str] = typer.Option(None, "--version", help="Version name the server reports (default: the "
                                                                  "directory's name)."),
    target: Optional[str] = typer.Option(None, "--target", help="Also check against this target first (a prepared "
                                                                "model name or a HF checkpoint dir)."),
    home: Optional[Path] = typer.Option(None, "--home", help="specopd home for resolving model names."),
) -> None:
    """Hot-swap DRAFTER into a running server: the same validated, all-or-nothing swap the trainer uses (the
    server refuses a drafter of another architecture or shape; the old one keeps serving). Prints the new and
    previous versions; exit 2 with "error: ..." otherwise."""
    from sglang_specopd.app.drafters.push import DrafterPushError, push_drafter_dir

    target_dir = _resolve(target, home) if target is not None else None
    try:
        res = push_drafter_dir(drafter, server, admin_key, version, target_dir)
    except DrafterPushError as exc:
        _fail(str(exc))
        return
    typer.echo(f"pushed {drafter} ({res.tensors} tensors): serving version {res.version!r} (was "
               f"{res.previous_version!r}, swap {res.swaps}{', radix cache flushed' if res.cache_flushed else ''})")
