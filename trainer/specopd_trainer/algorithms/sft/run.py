"""``run(context, config)`` of SFT: train on the context's sequences, push once at the end (rank 0)."""

from __future__ import annotations

from specopd_trainer.algorithms.registry import RunReport, TrainContext, fmt
from specopd_trainer.algorithms.sft.config import SFTConfig


def run(ctx: TrainContext, cfg: SFTConfig) -> RunReport:
    """SFT of ``ctx.drafter`` on ``ctx.train`` (held-out greedy-walk tau on ``ctx.holdout``) in ``ctx.run_dir``
    (resumes); rank 0 then pushes the drafter once when ``ctx.push`` is set. Runs under ``torchrun`` as DDP or FSDP2
    (``cfg.parallel``)."""
    from specopd_trainer.algorithms.sft.loop import train_sft
    from specopd_trainer.loops.common import dist_info

    rank, _ = dist_info()
    summary = train_sft(ctx.drafter, list(ctx.train), list(ctx.holdout), ctx.run_dir, cfg,
                        progress=ctx.progress and rank == 0)
    if rank == 0 and ctx.push is not None:
        ctx.push(summary["steps"], ctx.drafter)
    m = summary["metrics"]
    return RunReport(summary, (
        ("steps", str(summary["steps"])),
        ("loss (last step)", fmt(summary["loss"])),
        ("held-out greedy-walk tau", fmt(m.get("eval_walk_tau"), 3)),
        ("supervised tokens (this run)", str(summary["train_tokens"])),
        ("training wall time (s)", fmt(summary["wall_s"], 1)),
    ))
