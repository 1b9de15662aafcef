"""``specopd adapt``: keep training the drafter on the traffic a running SPECOPD server serves, deploying only what
measures better (:mod:`specopd_trainer.adapt`).

The command's options are the server session's (one server, or a fleet's workers; keys, drafter, target; as
``specopd train``), ``--run-dir``, ``--set KEY=VALUE`` (the algorithm's config fields), ``--summary-json`` and one
option per field of :class:`specopd_trainer.adapt.config.AdaptConfig` (``--field-name``, help from the field's
description), built from the model so that the CLI and the config cannot drift apart. The server (every worker) needs
``traffic_spool_mb > 0`` in its config (and ``traffic_features_mb > 0`` to hand over features captured while
serving) and an admin key.
"""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path
from typing import Any, Dict, List, Optional

import typer

from sglang_specopd.app.cli.apps import app
from sglang_specopd.app.train.options import (SERVER_NAMES, _config, _guarded, _o_admin_key, _o_api_key,
                                               _o_device, _o_dtype, _o_init, _o_target, _TrainFail,
                                               resolve_device_dtype, server_parameters)

_SESSION = (*SERVER_NAMES, "admin_key", "api_key", "init", "target", "device", "dtype", "run_dir", "set_",
            "summary_json", "progress", "metrics_port")
_HIDDEN = ("algorithm_options", "auto_options", "slice_header")  # slice_header: token ids, set by `specopd main` or found in the traffic


def _parse_sets(items: List[str]) -> Dict[str, Any]:
    """``["seqs_per_step=8", "loss=e2e_fkl"]`` -> ``{"seqs_per_step": 8, "loss": "e2e_fkl"}`` (values parsed as JSON
    when they are JSON, else kept as strings). Raises _TrainFail for an item without ``=``."""
    out: Dict[str, Any] = {}
    for it in items:
        key, sep, value = it.partition("=")
        if not sep or not key.strip():
            raise _TrainFail(f"bad option --set {it!r}: expected KEY=VALUE (a field of the algorithm's config)")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


def _field_parameters() -> List[inspect.Parameter]:
    from sglang_specopd.app.train.commands import _short_help
    from specopd_trainer.adapt.config import AdaptConfig

    params = []
    for name, finfo in AdaptConfig.model_fields.items():
        if name in _HIDDEN:
            continue
        ann = finfo.annotation
        flag = "--" + name.replace("_", "-")
        base = ann
        if typing.get_origin(ann) is typing.Union:
            base = [a for a in typing.get_args(ann) if a is not type(None)][0]
        decls = [f"{flag}/--no-{flag[2:]}"] if base is bool else [flag]
        default = finfo.get_default(call_default_factory=True)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann,
                                        default=typer.Option(default, *decls,
                                                             help=_short_help(finfo.description or ""))))
    return params


def _session_parameters() -> List[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    opts = [("admin_key", Optional[str], _o_admin_key()),
            ("api_key", Optional[str], _o_api_key()), ("init", Optional[Path], _o_init()),
            ("target", Optional[str], _o_target()), ("device", Optional[str], _o_device()),
            ("dtype", Optional[str], _o_dtype()),
            ("run_dir", Path, typer.Option(Path("runs/adapt"), "--run-dir", help="Traffic buffers, checkpoints, "
                                           "metrics.jsonl; an existing run resumes.")),
            ("set_", List[str], typer.Option([], "--set", help="KEY=VALUE: a field of the algorithm's config "
                                             "(repeatable), e.g. --set seqs_per_step=8.")),
            ("summary_json", Optional[Path], typer.Option(None, "--summary-json", help="Write the run's summary "
                                                          "there as JSON when it stops.")),
            ("progress", bool, typer.Option(True, "--progress/--no-progress", help="The progress line.")),
            ("metrics_port", Optional[int], typer.Option(None, "--metrics-port", help="Serve the adapter's "
                                                         "Prometheus metrics on this port (docs/metrics.md)."))]
    return server_parameters() + [inspect.Parameter(n, kw, annotation=t, default=o) for n, t, o in opts]


def run_adapt(*, server: Optional[str], admin_key: Optional[str], api_key: Optional[str], init: Optional[Path],
              target: Optional[str], run_dir: Path, set_: List[str], summary_json: Optional[Path], progress: bool,
              workers: Optional[str] = None, router: Optional[str] = None, fleet_run_dir: Optional[Path] = None,
              device: Optional[str] = None, dtype: Optional[str] = None, metrics_port: Optional[int] = None,
              **fields) -> Dict[str, Any]:
    """The body of ``specopd adapt``; returns the run's summary. Raises :class:`_TrainFail` on bad options, a server
    without a spool or admin key, a drafter the server would refuse, or a fleet whose workers serve different
    targets or drafters (``--workers`` / ``--fleet-run-dir``: :mod:`sglang_specopd.app.train.fleet_session`)."""
    from sglang_specopd.app.train.fleet_session import open_session, resolve_endpoints
    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.adapt.loop import AdaptError, Adapter

    cfg = _config(AdaptConfig, {}, {**fields, "algorithm_options": _parse_sets(set_)})
    device, torch_dtype = resolve_device_dtype(device, dtype)
    ends = resolve_endpoints(server, workers, router, fleet_run_dir, api_key)
    say = lambda msg: typer.echo(msg, err=True)  # noqa: E731
    if not admin_key:
        raise _TrainFail("specopd adapt reads the server's traffic and pushes drafters: pass --admin-key (or "
                         "SPECOPD_ADMIN_KEY) with the server's --admin-api-key")
    sess = open_session(ends, api_key, admin_key, init, target, need_push=True, say=say)
    sess.check_traffic()
    drafter = sess.load_drafter(device, torch_dtype)
    try:
        adapter = Adapter(sess.client, drafter, run_dir, cfg, push=sess.push, serving_version=sess.serving_version,
                          progress=progress)
    except AdaptError as exc:
        raise _TrainFail(str(exc)) from None
    except Exception as exc:  # the algorithm's config refused an override (pydantic)
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            raise _TrainFail(f"bad --set for {cfg.algorithm}: {exc.errors()[0].get('msg')}") from None
        raise
    if metrics_port:  # the adapter's own /metrics (sglang_specopd.app.adapt_metrics)
        from sglang_specopd.app.adapt_metrics import model_name_of, serve_adapt_metrics

        serve_adapt_metrics(adapter, metrics_port, model_name_of(sess))
        say(f"adapter metrics on http://0.0.0.0:{metrics_port}/metrics")
    say(f"adapting {drafter.drafter_arch.name} drafter {sess.init} with {cfg.algorithm} on the traffic of "
        f"{sess.where}: every {cfg.holdout_every}th request held out; run dir {run_dir}")
    result = adapter.run()
    out = drafter.save_pretrained(run_dir / "drafter-candidate", overwrite=True)
    adapter.deployed.save_pretrained(run_dir / "drafter-deployed", overwrite=True)
    result.update(candidate_dir=str(out), deployed_dir=str(run_dir / "drafter-deployed"))
    if summary_json is not None:
        summary_json.parent.mkdir(parents=True, exist_ok=True)
        summary_json.write_text(json.dumps(result, indent=1) + "\n")
    say(f"stopped ({result['stopped_by']}) at step {result['step']}: {result['pushes']} pushes, "
        f"{result['rollbacks']} rollbacks; the {'fleet' if ends.is_fleet else 'server'} serves "
        f"{result['deployed_version']!r}; "
        f"deployed drafter saved to {run_dir / 'drafter-deployed'}")
    if result.get("schedule"):
        from specopd_trainer.adapt.auto import describe

        say(describe(result["schedule"]))
    return result


def _build():
    from typer.core import DEFAULT_MARKUP_MODE  # noqa: F401  (Typer's own markup default for the help)

    params = _session_parameters() + _field_parameters()

    def command(**kwargs) -> None:
        _guarded(lambda: run_adapt(**kwargs))

    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = ("Keep training the drafter on the traffic a running SPECOPD server serves (its traffic spool), "
                       "and push a candidate only when it measures better than the deployed drafter on held-out "
                       "traffic. Stop with Ctrl-C (checkpointed; the same command resumes).")
    return command


def _register() -> None:
    from sglang_specopd.app.train.commands import OneLineCommand

    app.command("adapt", cls=OneLineCommand)(_build())


_register()
