"""``run(context, config)`` of Draft-OPD: live rollouts of the context's prompts, or the server's recorded traffic."""

from __future__ import annotations

from specopd_trainer.algorithms.draft_opd.config import DraftOPDConfig
from specopd_trainer.algorithms.registry import AlgorithmError, RunReport, TrainContext, fmt


def run(ctx: TrainContext, cfg: DraftOPDConfig) -> RunReport:
    """Draft-OPD on ``ctx.prompts`` (token-id lists; unused with ``cfg.from_traffic``) in ``ctx.run_dir``
    (resumes); pushes every ``cfg.push_every`` steps and at the end through ``ctx.push`` (rank 0 under ``torchrun``,
    DDP or FSDP2 as ``cfg.parallel`` says). Raises ValueError without ``ctx.push``, :class:`AlgorithmError` when a step
    finds nothing to replay (a server that does not speculate, no traffic, every record stale), and
    :class:`ShardingRefusedError` for ``from_traffic`` under ``torchrun``."""
    from specopd_trainer.algorithms.draft_opd.loop import train_draft_opd

    if ctx.push is None:
        raise ValueError("Draft-OPD pushes the drafter into the server: it needs a push function")
    try:
        summary = train_draft_opd(ctx.drafter, ctx.client, list(ctx.prompts), ctx.run_dir, cfg, push=ctx.push,
                                  progress=ctx.progress)
    except ValueError as exc:
        raise AlgorithmError(f"Draft-OPD stopped: {exc}") from None
    m = summary["metrics"]
    return RunReport(summary, (
        ("steps", f"{summary['steps']} (this run from {summary['start_step']})"),
        ("loss (last step)", fmt(summary["loss"])),
        ("served tau of the rollouts (last step)", fmt(m.get("rollout_tau"), 3)),
        ("est. tau of the replayed blocks (last step)", fmt(m.get("est_tau"), 3)),
        ("stale / unknown-version records dropped (last step)",
         f"{m.get('stale_records', 0)} / {m.get('unknown_version_records', 0)}"),
        ("supervised tokens", str(summary["supervised_tokens"])),
        ("supervised tokens / s", fmt(summary["supervised_tokens_per_s"], 1)),
        ("training wall time (s)", fmt(summary["wall_s"], 1)),
    ))
