"""``run(context, config)`` of SpecOPD: train on the context's reference sequences, pushing hot as configured."""

from __future__ import annotations

from specopd_trainer.algorithms.registry import RunReport, TrainContext, fmt
from specopd_trainer.algorithms.specopd.config import SpecOPDConfig


def run(ctx: TrainContext, cfg: SpecOPDConfig) -> RunReport:
    """SpecOPD on ``ctx.train`` (the held-out sequences are not used) in ``ctx.run_dir`` (resumes); rank 0 pushes
    every ``cfg.push_every`` steps and at the end when ``ctx.push`` is set. Runs under ``torchrun`` as DDP or FSDP2
    (``cfg.parallel``)."""
    from specopd_trainer.algorithms.specopd.loop import train_specopd
    from specopd_trainer.loops.common import dist_info

    rank, _ = dist_info()
    summary = train_specopd(ctx.drafter, ctx.client, list(ctx.train), ctx.run_dir, cfg, push=ctx.push,
                            progress=ctx.progress and rank == 0)
    m = summary["metrics"]
    return RunReport(summary, (
        ("steps", f"{summary['steps']} (this run from {summary['start_step']})"),
        ("loss (last step)", fmt(summary["loss"])),
        ("est. tau (last step)", fmt(m.get("est_tau"), 3)),
        ("alpha per slot (last step)", fmt(m.get("alpha"))),
        ("supervised tokens", str(summary["supervised_tokens"])),
        ("supervised tokens / s", fmt(summary["supervised_tokens_per_s"], 1)),
        ("training wall time (s)", fmt(summary["wall_s"], 1)),
    ))
