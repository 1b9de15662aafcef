"""Which drafter a server serves, and why: decided in one place, once per command.

:func:`decide_drafter` is the decision ``specopd serve``, ``specopd demo`` and ``specopd main`` (through
:func:`sglang_specopd.app.serve.spec.launch_spec`) enter once: :func:`choose_drafter` picks the directory and the
reason (``--drafter``; the config's drafter; for ``drafter: default`` the newest trained drafter when the command
prefers one, the shipped reference drafter, else the random-init default), then the random-init default is created
when missing, the drafter is checked against the target and :func:`serving_algorithm` names the
``--speculative-algorithm`` that serves it. The result is a :class:`DrafterChoice` (path, reason, algorithm).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional, Tuple

from sglang_specopd.app.config import ServeConfig
from sglang_specopd.app.launch.process import ServeError

DEFAULT_DRAFTER_LAYERS = 2
DEFAULT_BLOCK_SIZE = 8


class DrafterInvalidError(ServeError):
    """The configured drafter does not match the target (one line per problem in the message)."""


def default_drafter_dir(target_dir: Path, block_size: int) -> Path:
    """Where the default drafter of a target lives: ``$SPECOPD_HOME/drafters/<target>-b<B>-l2``."""
    from sglang_specopd.wire.home import drafters_dir

    return drafters_dir() / f"{target_dir.name}-b{block_size}-l{DEFAULT_DRAFTER_LAYERS}"


def random_drafter_refusal(cfg: ServeConfig, target_dir: Path, drafter: Optional[Path]) -> Optional[str]:
    """Why ``cfg`` may not serve ``drafter`` (one line), or None: ``drafter: default`` resolved to the random-init
    default drafter (no reference drafter ships for the target and block size) and the config does not set
    ``allow_random_drafter: true`` (a random drafter is accepted almost never: slower than no drafter)."""
    block = cfg.block_size or DEFAULT_BLOCK_SIZE
    if cfg.drafter != "default" or cfg.allow_random_drafter or drafter != default_drafter_dir(target_dir, block):
        return None
    return (f"config {cfg.name!r}: `drafter: default` but no drafter ships for {target_dir.name} (block {block}), so "
            f"it would serve a random-init drafter; set allow_random_drafter: true to serve one anyway, or give a "
            f"trained drafter (drafter: DIR in the config or --drafter DIR)")


#: The plugin's algorithm for each SGLang worker family: SPECOPD serves what the DFLASH worker serves (DFlash,
#: DFlash V2), SPECOPD_DSPARK what the DSPARK worker serves (DSpark); both add traces, hot swap and live traffic.
PLUGIN_ALGORITHMS = {"DFLASH": "SPECOPD", "DSPARK": "SPECOPD_DSPARK"}


def serving_algorithm(drafter: Path, algorithm: str) -> str:
    """The ``--speculative-algorithm`` that serves ``drafter`` when the config asks for ``algorithm``.

    ``SPECOPD`` (the plugin) becomes ``SPECOPD`` for a drafter of SGLang's DFLASH worker (``dflash``, ``dflash2``) and
    ``SPECOPD_DSPARK`` for one of its DSPARK worker (``dspark``), picked from the drafter's ``architectures``; the
    others are returned as given (upper-cased) when they serve the drafter's architecture.

    Raises:
        DrafterInvalidError: ``algorithm`` cannot serve the drafter's architecture (DFLASH / SPECOPD_DSPARK with a
            DSpark / DFlash drafter, DSPARK with a DFlash one), naming what does.
    """
    from sglang_specopd.wire.drafters.archs import UnknownDrafterArchError, arch_for_config
    from sglang_specopd.wire.drafters.format import read_drafter_config

    try:  # the architecture alone decides (a config SGLang resolves against the target is checked elsewhere)
        arch = arch_for_config(read_drafter_config(drafter))
    except (UnknownDrafterArchError, ValueError) as exc:
        raise DrafterInvalidError(f"drafter {drafter}: {exc}") from None
    algorithm = algorithm.upper()
    plugin = PLUGIN_ALGORITHMS.get(arch.speculative_algorithm)
    if algorithm == "SPECOPD" and plugin is not None:
        return plugin
    if algorithm in (arch.speculative_algorithm, plugin):
        return algorithm
    wanted = {"SPECOPD": "DFLASH", "SPECOPD_DSPARK": "DSPARK"}.get(algorithm, algorithm)
    uses = [f"speculative_algorithm: SPECOPD (the plugin's {plugin} worker: traces, hot swap)"] if plugin else []
    uses.append(f"{arch.speculative_algorithm} (SGLang's own worker, without the plugin's traces)")
    raise DrafterInvalidError(
        f"drafter {drafter} is a {arch.label} drafter, served by SGLang's {arch.speculative_algorithm} worker; "
        f"--speculative-algorithm {algorithm} serves {wanted} drafters only; serve it with {' or '.join(uses)}")


@dataclass(frozen=True)
class DrafterChoice:
    """Which drafter a server will use and why: ``path`` (None: no drafter; for ``how == DEFAULT_HOW`` the
    random-init default, created by :func:`decide_drafter` if missing), ``how`` (one line for the user) and, once
    :func:`decide_drafter` has validated it, the ``speculative_algorithm`` that serves it."""

    path: Optional[Path]
    how: str
    speculative_algorithm: Optional[str] = None


DEFAULT_HOW = "random-init default drafter (no trained drafter found)"


def trained_drafter_candidates(target_dir: Path, block_size: int) -> List[Tuple[Path, str]]:
    """Where ``specopd main`` leaves trained drafters for ``target_dir``: (directory, label) pairs, may not exist.

    The main job saves the drafter it adapted to new traffic and deployed as ``$SPECOPD_HOME/main_job/drafter-adapted``
    (see :mod:`sglang_specopd.app.main_job.run`); earlier versions of it saved an SFT drafter as
    ``$SPECOPD_HOME/drafters/<target>-sft-b8``.
    """
    from sglang_specopd.wire.home import drafters_dir, specopd_home

    return [(specopd_home() / "main_job" / "drafter-adapted", "drafter `specopd main` adapted to new traffic"),
            (drafters_dir() / f"{target_dir.name}-sft-b{block_size}", "SFT drafter of `specopd main`")]


def _weights_mtime(drafter: Path) -> Optional[float]:
    try:
        return (drafter / "model.safetensors").stat().st_mtime
    except OSError:
        return None


def newest_trained_drafter(target_dir: Path, block_size: int) -> Optional[DrafterChoice]:
    """The most recently saved trained drafter (:func:`trained_drafter_candidates`) that fits ``target_dir`` and
    has ``block_size``; None when there is none. Candidates that fail the drafter check are skipped."""
    import json

    from sglang_specopd.app.drafters.check import check_drafter

    fitting = []
    for path, label in trained_drafter_candidates(target_dir, block_size):
        mtime = _weights_mtime(path)
        if mtime is None:
            continue
        try:
            cfg = json.loads((path / "config.json").read_text())
            got_block = (cfg.get("dflash_config") or {}).get("block_size")
        except (OSError, ValueError, AttributeError):
            continue
        if got_block != block_size or check_drafter(path, target_dir):
            continue
        fitting.append((mtime, path, label))
    if not fitting:
        return None
    mtime, path, label = max(fitting, key=lambda t: t[0])
    saved = time.strftime("%Y-%m-%d %H:%M", time.localtime(mtime))
    return DrafterChoice(path, f"newest trained drafter: {label}, saved {saved}")


def choose_drafter(cfg: ServeConfig, target_dir: Path, override: Optional[str] = None,
                   prefer_trained: bool = False) -> DrafterChoice:
    """The drafter a server for ``cfg`` serves, and how it was chosen (nothing is created or validated here).

    Order: ``override`` (``--drafter``); no drafter when the config has none; the config's drafter directory; for
    ``drafter: default`` with ``prefer_trained`` (``specopd demo``) the newest fitting trained drafter
    (:func:`newest_trained_drafter`); then the shipped reference drafter of the target
    (:func:`sglang_specopd.app.drafters.reference.reference_drafter`); else the random-init default drafter
    (:func:`default_drafter_dir`).
    """
    if override is not None:
        return DrafterChoice(Path(override).expanduser(), "given with --drafter")
    if cfg.drafter is None or cfg.speculative_algorithm is None:
        return DrafterChoice(None, f"config {cfg.name!r} serves without a drafter")
    if cfg.drafter != "default":
        return DrafterChoice(Path(cfg.drafter).expanduser(), f"set in config {cfg.name!r}")
    block = cfg.block_size or DEFAULT_BLOCK_SIZE
    if prefer_trained:
        found = newest_trained_drafter(target_dir, block)
        if found is not None:
            return found
    from sglang_specopd.app.drafters.reference import reference_drafter

    shipped = reference_drafter(target_dir, block)
    if shipped is not None:
        return DrafterChoice(shipped, f"reference drafter shipped for {target_dir.name} (block {block}; how it was "
                                      f"trained: {shipped / 'training_record.json'})")
    how = DEFAULT_HOW if prefer_trained else (f"config {cfg.name!r} asks for the random-init default drafter; "
                                              "serve a trained one with --drafter DIR")
    return DrafterChoice(default_drafter_dir(target_dir, block), how)


def decide_drafter(cfg: ServeConfig, target_dir: Path, override: Optional[str] = None,
                   prefer_trained: bool = False) -> DrafterChoice:
    """THE drafter decision of a command: :func:`choose_drafter`'s choice, made ready and checked.

    No drafter when the config has no ``speculative_algorithm`` or no drafter (and none is given). Otherwise the
    random-init default is created when it is chosen and missing, the drafter is checked against ``target_dir``
    and the choice carries the ``speculative_algorithm`` that serves it (:func:`serving_algorithm`).

    Raises:
        DrafterInvalidError: the drafter fails :func:`sglang_specopd.app.drafters.check.check_drafter`, or the
            config's algorithm cannot serve its architecture.
    """
    if cfg.speculative_algorithm is None or (cfg.drafter is None and override is None):
        return DrafterChoice(None, f"config {cfg.name!r} serves without a drafter")
    from sglang_specopd.app.drafters.check import check_drafter

    choice = choose_drafter(cfg, target_dir, override=override, prefer_trained=prefer_trained)
    drafter = choice.path
    refused = None if override is not None else random_drafter_refusal(cfg, target_dir, drafter)
    if refused:
        raise DrafterInvalidError(refused)
    if override is None and cfg.drafter == "default" and not (drafter / "config.json").is_file():
        from sglang_specopd.wire.drafters.init import init_drafter  # the random-init default, once

        init_drafter(target_dir, drafter, block_size=cfg.block_size or DEFAULT_BLOCK_SIZE,
                     num_layers=DEFAULT_DRAFTER_LAYERS, overwrite=True)
    problems = check_drafter(drafter, target_dir)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise DrafterInvalidError(f"drafter {drafter} does not fit target {target_dir}:\n{lines}")
    return replace(choice, speculative_algorithm=serving_algorithm(drafter, cfg.speculative_algorithm))


def resolve_drafter(cfg: ServeConfig, target_dir: Path) -> Optional[Path]:
    """The drafter directory for ``cfg``, validated (:func:`decide_drafter`'s path; None: no drafter)."""
    return decide_drafter(cfg, target_dir).path
