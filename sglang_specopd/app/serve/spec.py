"""From a server config to a running SGLang server: resolve the target, take the drafter decision, check the port.

Every problem that can be seen before SGLang starts is raised here as a :class:`ServeError` subclass with one
readable message (target missing, drafter invalid, port in use, bad config), so ``specopd serve`` fails in one
line instead of deep inside SGLang. Which drafter serves is decided in :mod:`sglang_specopd.app.serve.choice`.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from sglang_specopd.app.config import ServeConfig
from sglang_specopd.app.launch.process import LaunchSpec, ServeError, check_port_free
from sglang_specopd.app.serve.choice import DrafterChoice, decide_drafter


def serve_target(cfg: ServeConfig) -> Path:
    """The target directory of ``cfg`` (``TargetNotFoundError`` raised as a :class:`ServeError`)."""
    from sglang_specopd.app.models import ModelsError, resolve_target

    try:
        return resolve_target(cfg.target)
    except ModelsError as exc:
        raise ServeError(str(exc)) from None


def launch_spec(cfg: ServeConfig, *, host: str = "127.0.0.1", port: int = 30000, api_key: Optional[str] = None,
                admin_api_key: Optional[str] = None, drafter: Optional[str] = None,
                extra_args: Sequence[str] = (), choice: Optional[DrafterChoice] = None) -> LaunchSpec:
    """Validate everything checkable before launch and return the :class:`LaunchSpec` for ``cfg``.

    ``choice`` is the command's drafter decision (:func:`sglang_specopd.app.serve.choice.decide_drafter`, taken
    once by the command); without it the decision is taken here, with ``drafter`` (a directory) overriding the
    config's drafter. The spec's ``speculative_algorithm`` is the choice's: ``SPECOPD`` becomes
    ``SPECOPD_DSPARK`` for a DSpark drafter. Raises :class:`ServeError` subclasses: ``TargetNotFoundError``
    (wrapped), ``DrafterInvalidError``, ``PortInUseError``.
    """
    from sglang_specopd.app.cpu_dtype import resolve_dtype

    target = serve_target(cfg)
    if choice is None:
        choice = decide_drafter(cfg, target, override=drafter)
    drafter_dir = choice.path
    check_port_free(host, port)
    return LaunchSpec(
        model_path=str(target), served_model_name=cfg.served_model_name or target.name, host=host, port=port, device=cfg.device,
        dtype=resolve_dtype(cfg.device, cfg.dtype),
        drafter_path=str(drafter_dir) if drafter_dir else None,
        speculative_algorithm=choice.speculative_algorithm if drafter_dir else None,
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
    return Path(__file__).resolve().parents[2] / "server_configs"


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


