"""``specopd train <algorithm>``, generated from the training-algorithm registry (:mod:`specopd_trainer.algorithms`).

:class:`AlgorithmGroup` is the ``train`` group: it lists the registry's algorithms and builds each command when it
is asked for (so an algorithm registered at any time, e.g. by a test, appears without touching this module). A
command has the shared options (server, keys, drafter, target, data, run dir, data sizes, version prefix,
progress) and one option per config field of the algorithm (flag from the algorithm's ``flags`` or ``--field-name``,
default from its recipe, help from the field's description); its body is :func:`run_algorithm`.

Usage errors (a missing or malformed option, an unknown algorithm) print ONE ``error: ...`` line and exit 2
(:class:`OneLineErrors`), as every failure of the commands' bodies does (:func:`_guarded`).
"""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any, Dict, List, Optional

import typer
from typer.core import TyperCommand, TyperGroup

try:  # Typer vendors click (typer._click) from 0.2x on; its commands raise that copy's UsageError
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older Typer on the real click
    from click import UsageError

from sglang_specopd.app.train.options import (
    SERVER_NAMES, _config, _guarded, _o_admin_key, _o_api_key, _o_data, _o_device, _o_dtype, _o_init,
    _o_max_new_tokens, _o_per_domain, _o_progress, _o_run_dir, _o_target, _o_version_prefix, _sayer, _TrainFail,
    resolve_device_dtype, server_parameters)

# the shared options every algorithm command has (name -> option factory); data-size options depend on the data
_SHARED = (*SERVER_NAMES, "admin_key", "api_key", "init", "target", "device", "dtype", "data", "run_dir",
           "per_domain", "max_new_tokens", "max_prompt_tokens", "version_prefix", "progress")
_OPTION_TYPES = (int, float, str, bool)


class OneLineErrors:
    """Mixin for click commands: a usage error while parsing this command's arguments prints ``error: <message>``
    on stderr (one line, no usage block) and exits 2."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as exc:
            typer.echo(f"error: {_one_line(exc.format_message())}", err=True)
            raise typer.Exit(2) from None


def _one_line(msg: str) -> str:
    return " ".join(msg.split())


class OneLineCommand(OneLineErrors, TyperCommand):
    """A Typer command whose usage errors are one ``error:`` line."""


class AlgorithmGroup(OneLineErrors, TyperGroup):
    """The ``train`` group: one command per registered training algorithm, built on demand."""

    _cache: Dict[str, tuple] = {}  # name -> (algorithm, its command)

    def list_commands(self, ctx) -> List[str]:
        from specopd_trainer.algorithms import registry

        static = super().list_commands(ctx)
        return static + [n for n in registry.names() if n not in static]

    def get_command(self, ctx, cmd_name: str) :
        from specopd_trainer.algorithms import registry

        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            return cmd
        try:
            alg = registry.get(cmd_name)
        except registry.UnknownAlgorithmError:
            return None
        cached = self._cache.get(alg.name)
        if cached is None or cached[0] is not alg:  # built once per registered entry
            cached = self._cache[alg.name] = (alg, algorithm_command(alg))
        return cached[1]

    def resolve_command(self, ctx, args: List[str]):
        from specopd_trainer.algorithms import registry

        try:
            return super().resolve_command(ctx, args)
        except UsageError as exc:
            typer.echo(f"error: {_one_line(exc.format_message())} Algorithms: {', '.join(registry.names())}.",
                       err=True)
            raise typer.Exit(2) from None


def _field_parameter(alg, name: str, finfo, default: Any) -> inspect.Parameter:
    """The Typer option of config field ``name``: its type (int, float, str, bool, Optional of one, or a Literal),
    flag, recipe default and description. Raises TypeError for other types (list the field in ``hidden``)."""
    ann = finfo.annotation
    base = ann
    if typing.get_origin(ann) is typing.Union:
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        base = args[0] if len(args) == 1 else None
    if not (base in _OPTION_TYPES or typing.get_origin(base) is typing.Literal):
        raise TypeError(f"algorithm {alg.name!r}: config field {name!r} of type {ann!r} cannot be a CLI option; "
                        "list it in the algorithm's hidden fields")
    flag = alg.flag(name)
    decls = [f"{flag}/--no-{flag[2:]}"] if base is bool else [flag]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann,
                             default=typer.Option(default, *decls, help=_short_help(finfo.description or "")))


def _short_help(description: str) -> str:
    """A field description's first sentence; when that is long (> 160 characters), its part before the first
    ``": "``. The config model keeps the whole description."""
    text = " ".join(description.split())
    first = text.split(". ")[0].rstrip(".")
    if len(first) > 160 and ": " in first:
        first = first.split(": ")[0]
    if not first:
        return ""
    word = first.split()[0]
    if not any(c in word for c in "._"):  # not an identifier or file name (metrics.jsonl, torch.autocast)
        first = first[:1].upper() + first[1:]
    return first + "."


def _shared_parameters(alg) -> List[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    opts = [("admin_key", Optional[str], _o_admin_key()),
            ("api_key", Optional[str], _o_api_key()), ("init", Optional[Path], _o_init()),
            ("target", Optional[str], _o_target()), ("device", Optional[str], _o_device()),
            ("dtype", Optional[str], _o_dtype()), ("data", str, _o_data()), ("run_dir", Path, _o_run_dir(alg.name)),
            ("per_domain", int, _o_per_domain())]
    if alg.data == "sequences":
        opts.append(("max_new_tokens", int, _o_max_new_tokens()))
    else:
        opts.append(("max_prompt_tokens", int, typer.Option(1024, "--max-prompt-tokens", min=1,
                                                            help="Skip longer prompts.")))
    opts += [("version_prefix", Optional[str], _o_version_prefix()), ("progress", bool, _o_progress())]
    return server_parameters() + [inspect.Parameter(n, kw, annotation=t, default=o) for n, t, o in opts]


def algorithm_command(alg):
    """The (Typer / click) command ``specopd train <alg.name>`` for registry entry ``alg``."""
    from typer.core import DEFAULT_MARKUP_MODE
    from typer.main import get_command_from_info
    from typer.models import CommandInfo

    fields = alg.config.model_fields
    clash = [n for n in alg.option_fields() if n in _SHARED]
    if clash:
        raise TypeError(f"algorithm {alg.name!r}: config fields {clash} clash with the shared train options")
    defaults = alg.defaults()
    params = _shared_parameters(alg) + [_field_parameter(alg, n, fields[n], defaults[n]) for n in alg.option_fields()]

    def command(**kwargs) -> None:
        shared = {k: kwargs.pop(k) for k in _SHARED if k in kwargs}
        _guarded(lambda: run_algorithm(alg, options=kwargs, **shared))

    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    info = CommandInfo(name=alg.name, cls=OneLineCommand, callback=command, help=alg.help)
    return get_command_from_info(info, pretty_exceptions_short=True, rich_markup_mode=DEFAULT_MARKUP_MODE)


def run_algorithm(alg, *, options: Dict[str, Any], server: Optional[str], admin_key: Optional[str],
                  api_key: Optional[str], init: Optional[Path], target: Optional[str], data: str, run_dir: Path,
                  per_domain: int, version_prefix: Optional[str], progress: bool, max_new_tokens: Optional[int] = None,
                  max_prompt_tokens: Optional[int] = None, workers: Optional[str] = None, router: Optional[str] = None,
                  fleet_run_dir: Optional[Path] = None, device: Optional[str] = None,
                  dtype: Optional[str] = None) -> None:
    """The body of ``specopd train <alg.name>``: config from ``options`` (config field -> value), server session,
    run-config check (resume), drafter, data (sequences or prompts as the algorithm declares), ``alg.run``, then on
    rank 0 the saved drafter and the summary table. Raises :class:`_TrainFail` on bad options or data."""
    from sglang_specopd.app.train.fleet_session import open_session, resolve_endpoints
    from sglang_specopd.app.train.data import _check_run_config, _load_prompts, _load_sequences, _parse_domains, _record
    from sglang_specopd.app.train.session import _finish
    from specopd_trainer.algorithms.registry import TrainContext
    from specopd_trainer.loops.common import dist_info

    cfg = _config(alg.make_config, {n: alg.flag(n) for n in alg.config.model_fields}, options)
    _parse_domains(data)  # fail on a bad --data before touching the server
    device, torch_dtype = resolve_device_dtype(device, dtype)
    ends = resolve_endpoints(server, workers, router, fleet_run_dir, api_key)
    rank, world = dist_info()
    if world > 1 and not alg.distributed:
        raise _TrainFail(f"{alg.name} runs in a single process (not under torchrun)")
    say = _sayer(rank)
    sess = open_session(ends, api_key, admin_key, init, target, need_push=alg.needs_push, say=say)
    data_opts = ({"per_domain": per_domain, "max_new_tokens": max_new_tokens} if alg.data == "sequences" else
                 {"per_domain": per_domain, "max_prompt_tokens": max_prompt_tokens})
    resuming = _check_run_config(run_dir, _record(alg.name, cfg, data, data_opts), rank)
    drafter = sess.load_drafter(device, torch_dtype)
    if alg.data == "sequences":
        train, holdout = _load_sequences(sess, data, drafter.spec.target_layer_ids, run_dir, per_domain=per_domain,
                                         max_new_tokens=max_new_tokens, rank=rank, world=world, say=say)
        loaded, what = {"train": train, "holdout": holdout}, f"{len(train)} sequences ({len(holdout)} held out)"
    else:
        prompts = _load_prompts(sess, data, per_domain=per_domain, max_prompt_tokens=max_prompt_tokens)
        loaded, what = {"prompts": prompts}, f"{len(prompts)} prompts"
    say(f"{'resuming' if resuming else 'starting'} {alg.title} in {run_dir}: {what}, drafter {sess.init}, "
        f"target {sess.target}, {world} rank(s)")
    versions: List[str] = []
    push = sess.pusher(version_prefix or f"{alg.prefix}-{run_dir.name}", versions)
    report = alg.run(TrainContext(drafter, sess.client, run_dir, push=push, progress=progress, **loaded), cfg)
    if rank == 0:
        sess.finish_pushes(drafter, versions)  # a fleet's push deferred while a worker was down
        _finish(sess, drafter, run_dir, alg.name, list(report.rows), versions)
