"""``specopd serve --dry-run``: check a server config without the model weights and without a GPU, and print the
exact SGLang command it would run.

Checks, each reported as ``ok`` / ``note`` (SGLang serves it, read this) / ``error`` (it would not serve):

* the config (strict schema, already by :meth:`ServeConfig.load`), the attention backend among SGLang 0.5.23's
  ``ATTENTION_BACKEND_CHOICES`` (read from the installed source, not imported: importing SGLang takes seconds);
* the target's config.json (the target directory when it is here, else ``--target-config DIR``): tensor-parallel
  size vs its attention heads, KV heads, MLP width and GDN heads (SGLang splits each over the ranks: KV heads may
  be replicated when fewer than the ranks, if the ranks are a multiple of them);
* the drafter (its directory, else ``--drafter-config DIR``) resolved exactly as SGLang resolves it against that
  target (:func:`sglang_specopd.wire.drafters.archs.resolve_drafter_config`: block size, context layers, mask token),
  its hidden size / layer ids against the target, its heads vs the tensor-parallel size, its tensors when its
  weights are here, the speculative algorithm that serves its architecture, the config's block size vs the
  drafter's;
* what cannot be checked here is said so (``note: not checked: ...``).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from sglang_specopd.app.config import ServeConfig
from sglang_specopd.app.serve.dry_drafter import check_drafter_dir, tp_problems, tp_size  # noqa: F401 (API)


@dataclass
class DryRun:
    """What a dry run found (``ok`` / ``notes`` / ``problems`` lines) and the launch it would do: ``argv`` and the
    environment variables the launcher sets (``env``, only those differing from this process's)."""

    argv: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    ok: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)

    @property
    def command(self) -> str:
        """The shell command: ``K=V ... python -m sglang.launch_server ...`` (quoted)."""
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (prefix + " " if prefix else "") + shlex.join(self.argv)


def attention_backend_choices() -> List[str]:
    """SGLang's ``ATTENTION_BACKEND_CHOICES`` (``srt/arg_groups/choices.py``), parsed from the installed source."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return []
    path = Path(list(spec.submodule_search_locations)[0]) / "srt" / "arg_groups" / "choices.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ATTENTION_BACKEND_CHOICES"
                                                for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def _config_dir(primary: Optional[Path], fallback: Optional[str]) -> Optional[Path]:
    if primary is not None and (primary / "config.json").is_file():
        return primary
    if fallback is not None:
        return Path(fallback).expanduser()
    return None


def dry_run(cfg: ServeConfig, *, host: str = "127.0.0.1", port: int = 30000, api_key: Optional[str] = None,
            admin_api_key: Optional[str] = None, drafter: Optional[str] = None, extra_args: Sequence[str] = (),
            target_config: Optional[str] = None, drafter_config: Optional[str] = None) -> DryRun:
    """Check ``cfg`` as far as possible without the weights and a GPU (module docstring); nothing is created,
    started or bound. ``target_config`` / ``drafter_config``: directories holding the target's / drafter's
    config.json (and the target's tokenizer.json if any) when the checkpoints are not here."""
    from sglang_specopd.app.cpu_dtype import resolve_dtype
    from sglang_specopd.app.launch.process import LaunchSpec, server_env
    from sglang_specopd.app.models import ModelsError, resolve_target
    from sglang_specopd.app.serve.choice import choose_drafter, random_drafter_refusal
    from sglang_specopd.server.drafter.upload import limit_env
    from sglang_specopd.wire.policy import policy_env

    out = DryRun()
    out.ok.append(f"config {cfg.name!r}: valid")
    args = list(cfg.extra_sglang_args) + list(extra_args)
    try:
        target_dir: Optional[Path] = resolve_target(cfg.target)
        out.ok.append(f"target {target_dir}: present")
    except ModelsError:
        target_dir = None
        out.notes.append(f"not checked: target {cfg.target} is not here (its weights, shapes and tokenizer)")
    tdir = _config_dir(target_dir, target_config)
    tcfg = None
    if tdir is not None:
        try:
            tcfg = json.loads((tdir / "config.json").read_text())
            out.ok.append(f"target config: {tdir / 'config.json'}")
        except (OSError, ValueError) as exc:
            out.problems.append(f"target config {tdir / 'config.json'}: {exc}")
    try:
        tp = tp_size(args)
    except (ValueError, IndexError):
        out.problems.append(f"--tp-size in {args} is not an integer")
        tp = 1
    if tcfg is not None:
        found = tp_problems(tcfg, tp, "target")
        out.problems += found
        if tp > 1 and not found:
            out.ok.append(f"--tp-size {tp}: the target's heads, KV heads and MLP widths split evenly")
    choice = choose_drafter(cfg, target_dir or Path(cfg.target), override=drafter)
    refused = random_drafter_refusal(cfg, target_dir or Path(cfg.target), choice.path)
    if refused:
        out.problems.append(refused)
    algorithm = None
    if choice.path is not None:
        ddir = _config_dir(choice.path, drafter_config)
        if ddir is None:
            out.notes.append(f"not checked: drafter {choice.path} is not here ({choice.how})")
        else:
            algorithm = check_drafter_dir(out, cfg, ddir, tdir, tp)
    backend = cfg.attention_backend
    choices = attention_backend_choices()
    if backend is not None and choices and backend not in choices:
        out.problems.append(f"attention_backend {backend!r} is not one of SGLang 0.5.23's: {', '.join(choices)}")
    elif backend is not None:
        out.ok.append(f"attention_backend {backend!r}: an SGLang 0.5.23 backend")
    if cfg.device == "cuda" and backend == "torch_native":
        out.notes.append("attention_backend torch_native on CUDA: SGLang's slow reference path")
    if cfg.device == "cuda" and not cfg.checked_on_gpu:
        out.notes.append(f"config {cfg.name!r} has not yet been checked on a GPU")
    if cfg.device == "cpu" and tp > 1:
        out.problems.append(f"--tp-size {tp} on the CPU engine: specopd serves CPU targets on one process")
    spec = LaunchSpec(
        model_path=str(target_dir or cfg.target), host=host, port=port,
        served_model_name=cfg.served_model_name or Path(target_dir or cfg.target).name, device=cfg.device,
        dtype=resolve_dtype(cfg.device, cfg.dtype),
        drafter_path=str(choice.path) if choice.path else None,
        speculative_algorithm=(algorithm or cfg.speculative_algorithm) if choice.path else None,
        block_size=cfg.block_size, attention_backend=cfg.attention_backend, max_total_tokens=cfg.max_total_tokens,
        mem_fraction_static=cfg.mem_fraction_static, max_running_requests=cfg.max_running_requests,
        disable_cuda_graph=cfg.disable_cuda_graph, disable_overlap_schedule=cfg.disable_overlap_schedule,
        sleep_on_idle=cfg.sleep_on_idle, api_key=api_key, admin_api_key=admin_api_key,
        prefix_cache_mb=cfg.score_trees_prefix_cache_mb, score_budget_tokens=cfg.score_trees_budget_tokens,
        score_queue_max=cfg.score_trees_queue_max, score_max_request_mb=cfg.score_trees_max_request_mb,
        score_queue_wait_s=cfg.score_trees_queue_wait_s, traffic_spool_mb=cfg.traffic_spool_mb,
        traffic_features_mb=cfg.traffic_features_mb, drafter_max_payload_mb=cfg.drafter_max_payload_mb,
        extra_args=args)
    out.argv = spec.argv()
    env = server_env(cfg.device, prefix_cache_mb=spec.prefix_cache_mb, score=spec.score_settings(),
                     traffic_spool_mb=spec.traffic_spool_mb, traffic_features_mb=spec.traffic_features_mb)
    env.update({**policy_env(cfg.speculative_policy), **limit_env(cfg.drafter_max_payload_mb)})  # as start() adds
    out.env = {k: v for k, v in env.items() if os.environ.get(k) != v}
    return out
