"""From a server config to a running SGLang server: resolve the target, validate the drafter, check the port.

Every problem that can be seen before SGLang starts is raised here as a :class:`ServeError` subclass with one
readable message (target missing, drafter invalid, port in use, bad config), so ``specopd serve`` fails in one
line instead of deep inside SGLang.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

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
    """The drafter directory for ``cfg`` (created for ``drafter: default`` when missing), validated.

    Raises:
        DrafterInvalidError: the drafter fails :func:`sglang_specopd.app.drafter_check.check_drafter`.
    """
    if cfg.drafter is None or cfg.speculative_algorithm is None:
        return None
    from sglang_specopd.app.drafter_check import check_drafter

    if cfg.drafter == "default":
        drafter = default_drafter_dir(target_dir, cfg.block_size or DEFAULT_BLOCK_SIZE)
        if not (drafter / "config.json").is_file():
            from sglang_specopd.wire.drafter_init import init_drafter

            init_drafter(target_dir, drafter, block_size=cfg.block_size or DEFAULT_BLOCK_SIZE,
                         num_layers=DEFAULT_DRAFTER_LAYERS, overwrite=True)
    else:
        drafter = Path(cfg.drafter).expanduser()
    problems = check_drafter(drafter, target_dir)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise DrafterInvalidError(f"drafter {drafter} does not fit target {target_dir}:\n{lines}")
    return drafter


def launch_spec(cfg: ServeConfig, *, host: str = "127.0.0.1", port: int = 30000, api_key: Optional[str] = None,
                admin_api_key: Optional[str] = None, drafter: Optional[str] = None,
                extra_args: Sequence[str] = ()) -> LaunchSpec:
    """Validate everything checkable before launch and return the :class:`LaunchSpec` for ``cfg``.

    ``drafter`` overrides the config's drafter (a directory). Raises :class:`ServeError` subclasses:
    ``TargetNotFoundError`` (wrapped), :class:`DrafterInvalidError`, ``PortInUseError``.
    """
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
        model_path=str(target), host=host, port=port, device=cfg.device, dtype=cfg.dtype,
        drafter_path=str(drafter_dir) if drafter_dir else None,
        speculative_algorithm=cfg.speculative_algorithm if drafter_dir else None,
        block_size=cfg.block_size, attention_backend=cfg.attention_backend, max_total_tokens=cfg.max_total_tokens,
        mem_fraction_static=cfg.mem_fraction_static, max_running_requests=cfg.max_running_requests,
        disable_cuda_graph=cfg.disable_cuda_graph, disable_overlap_schedule=cfg.disable_overlap_schedule,
        sleep_on_idle=cfg.sleep_on_idle, api_key=api_key, admin_api_key=admin_api_key,
        prefix_cache_mb=cfg.score_trees_prefix_cache_mb,
        extra_args=list(cfg.extra_sglang_args) + list(extra_args),
    )


def config_path(name_or_path: str) -> Path:
    """A config given by path, or by name in the repository's ``server_configs/`` (``cpu-smollm2``)."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    repo_cfg = Path(__file__).resolve().parents[2] / "server_configs" / f"{name_or_path}.yaml"
    return repo_cfg if repo_cfg.is_file() else p
