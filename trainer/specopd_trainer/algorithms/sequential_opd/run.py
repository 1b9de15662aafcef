"""``run(context, config)`` of sequential-rollout OPD: roll out the context's prompts through the server."""

from __future__ import annotations

from specopd_trainer.algorithms.registry import AlgorithmError, RunReport, TrainContext, fmt
from specopd_trainer.algorithms.sequential_opd.config import SequentialOPDConfig


def run(ctx: TrainContext, cfg: SequentialOPDConfig) -> RunReport:
    """Sequential OPD on ``ctx.prompts`` (token-id lists) in ``ctx.run_dir`` (resumes); pushes before every step
    and at the end through ``ctx.push``. Raises ValueError without ``ctx.push`` or under ``torchrun``, and
    :class:`AlgorithmError` when the server's rollouts carry no verify records (a server that does not speculate).
    """
    from specopd_trainer.algorithms.sequential_opd.loop import train_sequential_opd

    if ctx.push is None:
        raise ValueError("sequential OPD pushes the drafter before every step: it needs a push function")
    try:
        summary = train_sequential_opd(ctx.drafter, ctx.client, list(ctx.prompts), ctx.run_dir, cfg, push=ctx.push,
                                       progress=ctx.progress)
    except ValueError as exc:  # e.g. rollouts without verify records (a server that does not speculate)
        raise AlgorithmError(f"sequential OPD stopped: {exc}") from None
    m = summary["metrics"]
    return RunReport(summary, (
        ("steps", f"{summary['steps']} (this run from {summary['start_step']})"),
        ("loss (last step)", fmt(summary["loss"])),
        ("est. tau (last step)", fmt(m.get("est_tau"), 3)),
        ("supervised tokens", str(summary["supervised_tokens"])),
        ("supervised tokens / s", fmt(summary["supervised_tokens_per_s"], 1)),
        ("training wall time (s)", fmt(summary["wall_s"], 1)),
    ))
