"""From a server config to a running SGLang server: resolve the target, validate the drafter, check the port.

Every problem that can be seen before SGLang starts is raised here as a :class:`ServeError` subclass with one
readable message (target missing, drafter invalid, port in use, bad config), so ``specopd serve`` fails in one
line instead of deep inside SGLang.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from sglang_specopd.app.config import ServeConfig
from sglang_specopd.app.launch import LaunchSpec, ServeError, check_port_free

DEFAULT_DRAFTER_LAYERS = 2
DEFAULT_BLOCK_SIZE = 8


class DrafterInvalidError(ServeError):
    """The configured drafter does not match the target (one line per problem in the message)."""


def default_drafter_dir(target_dir: Path, block_size: int) -> Path:
    """Where the default drafter of a target lives: ``$SPECOPD_HOME/drafters/<target>-b<B>-l2``."""
    from sglang_specopd.wire.home import drafters_dir

    return drafters_dir() / f"{target_dir.name}-b{block_size}-l{DEFAULT_DRAFTER_LAYERS}"


def resolve_drafter(cfg: ServeConfig, target_dir: Path) -> Optional[Path]:
    """The drafter directory for ``cfg``, validated. ``drafter: default`` is the reference drafter shipped for the
    target and block size (:mod:`sglang_specopd.app.reference_drafters`) when there is one, else the random-init
    default drafter (created when missing).

    Raises:
        DrafterInvalidError: the drafter fails :func:`sglang_specopd.app.drafter_check.check_drafter`.
    """
    if cfg.drafter is None or cfg.speculative_algorithm is None:
        return None
    from sglang_specopd.app.drafter_check import check_drafter

    drafter = choose_drafter(cfg, target_dir).path  # one place decides reference vs random-init default
    refused = random_drafter_refusal(cfg, target_dir, drafter)
    if refused:
        raise DrafterInvalidError(refused)
    if cfg.drafter == "default" and not (drafter / "config.json").is_file():  # the random-init default, once
        from sglang_specopd.wire.drafter_init import init_drafter

        init_drafter(target_dir, drafter, block_size=cfg.block_size or DEFAULT_BLOCK_SIZE,
                     num_layers=DEFAULT_DRAFTER_LAYERS, overwrite=True)
    problems = check_drafter(drafter, target_dir)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise DrafterInvalidError(f"drafter {drafter} does not fit target {target_dir}:\n{lines}")
    serving_algorithm(drafter, cfg.speculative_algorithm)
    return drafter


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
    from sglang_specopd.wire.drafter_archs import UnknownDrafterArchError, arch_for_config
    from sglang_specopd.wire.drafter_format import read_drafter_config

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


def launch_spec(cfg: ServeConfig, *, host: str = "127.0.0.1", port: int = 30000, api_key: Optional[str] = None,
                admin_api_key: Optional[str] = None, drafter: Optional[str] = None,
                extra_args: Sequence[str] = ()) -> LaunchSpec:
    """Validate everything checkable before launch and return the :class:`LaunchSpec` for ``cfg``.

    ``drafter`` overrides the config's drafter (a directory). The spec's ``speculative_algorithm`` is
    :func:`serving_algorithm`'s: ``SPECOPD`` becomes ``SPECOPD_DSPARK`` for a DSpark drafter. Raises
    :class:`ServeError` subclasses: ``TargetNotFoundError`` (wrapped), :class:`DrafterInvalidError`,
    ``PortInUseError``.
    """
    from sglang_specopd.app.cpu_dtype import resolve_dtype
    from sglang_specopd.app.models import ModelsError, resolve_target

    if drafter is not None:
        cfg = cfg.model_copy(update={"drafter": drafter})
    try:
        target = resolve_target(cfg.target)
    except ModelsError as exc:
        raise ServeError(str(exc)) from None
    drafter_dir = resolve_drafter(cfg, target)
    check_port_free(host, port)
    return LaunchSpec(
        model_path=str(target), served_model_name=cfg.served_model_name or target.name, host=host, port=port, device=cfg.device,
        dtype=resolve_dtype(cfg.device, cfg.dtype),
        drafter_path=str(drafter_dir) if drafter_dir else None,
        speculative_algorithm=serving_algorithm(drafter_dir, cfg.speculative_algorithm) if drafter_dir else None,
        block_size=cfg.block_size, attention_backend=cfg.attention_backend, max_total_tokens=cfg.max_total_tokens,
        mem_fraction_static=cfg.mem_fraction_static, max_running_requests=cfg.max_running_requests,
        disable_cuda_graph=cfg.disable_cuda_graph, disable_overlap_schedule=cfg.disable_overlap_schedule,
        sleep_on_idle=cfg.sleep_on_idle, api_key=api_key, admin_api_key=admin_api_key,
        prefix_cache_mb=cfg.score_trees_prefix_cache_mb, score_budget_tokens=cfg.score_trees_budget_tokens,
        score_queue_max=cfg.score_trees_queue_max, score_max_request_mb=cfg.score_trees_max_request_mb,
        score_queue_wait_s=cfg.score_trees_queue_wait_s,
        traffic_spool_mb=cfg.traffic_spool_mb, traffic_features_mb=cfg.traffic_features_mb,
        speculative_policy=cfg.speculative_policy, drafter_max_payload_mb=cfg.drafter_max_payload_mb,
        extra_args=list(cfg.extra_sglang_args) + list(extra_args),
    )


def shipped_configs_dir() -> Path:
    """The server configs shipped with the package: ``sglang_specopd/server_configs`` (in the source tree a link to
    the top-level ``server_configs/``; a real directory in an installed wheel)."""
    return Path(__file__).resolve().parents[1] / "server_configs"


def shipped_config_names() -> List[str]:
    """Names of the shipped configs (``cpu-smollm2``, ...), sorted; what ``--config NAME`` accepts."""
    d = shipped_configs_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def config_path(name_or_path: str) -> Path:
    """A config given by path, or by name among the shipped configs (``cpu-smollm2``), resolved; the path as given
    when it is neither (``ServeConfig.load`` then reports it missing)."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    shipped = shipped_configs_dir() / f"{name_or_path}.yaml"
    return shipped.resolve() if shipped.is_file() else p


@dataclass(frozen=True)
class DrafterChoice:
    """Which drafter a server will use and why: ``path`` (None: no drafter; for ``how == DEFAULT_HOW`` the
    random-init default, created at launch if missing) and ``how`` (one line for the user)."""

    path: Optional[Path]
    how: str


DEFAULT_HOW = "random-init default drafter (no trained drafter found)"


def trained_drafter_candidates(target_dir: Path, block_size: int) -> List[Tuple[Path, str]]:
    """Where ``specopd main`` leaves trained drafters for ``target_dir``: (directory, label) pairs, may not exist.

    The main job saves the drafter it adapted to new traffic and deployed as ``$SPECOPD_HOME/main_job/drafter-adapted``
    (see :mod:`sglang_specopd.app.main_job`); earlier versions of it saved an SFT drafter as
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

    from sglang_specopd.app.drafter_check import check_drafter

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
    (:func:`sglang_specopd.app.reference_drafters.reference_drafter`); else the random-init default drafter
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
    from sglang_specopd.app.reference_drafters import reference_drafter

    shipped = reference_drafter(target_dir, block)
    if shipped is not None:
        return DrafterChoice(shipped, f"reference drafter shipped for {target_dir.name} (block {block}; how it was "
                                      f"trained: {shipped / 'training_record.json'})")
    how = DEFAULT_HOW if prefer_trained else (f"config {cfg.name!r} asks for the random-init default drafter; "
                                              "serve a trained one with --drafter DIR")
    return DrafterChoice(default_drafter_dir(target_dir, block), how)
