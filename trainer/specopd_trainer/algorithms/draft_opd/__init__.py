"""Draft-OPD: acceptance-aware on-policy distillation replayed at the error anchors of real speculative decoding.

Each step pushes the drafter (every ``push_every`` steps), collects verify records of real draft-and-verify
decoding through the live server (many requests in flight) or from the traffic the server recorded, drops the
records of stale drafter versions, replays the drafter at the blocks that had a rejection and trains with
forward KL on the accepted slots and gamma-weighted reverse KL on the rejected ones (loss ``draft_opd``).
Paper code: bingyang-lei/Draft-OPD. Modules: :mod:`.config`, :mod:`.rollouts` (sources and verify records),
:mod:`.versions` (staleness), :mod:`.replay` (selection, loss), :mod:`.ranks` (under torchrun),
:mod:`.loop` (:func:`train_draft_opd`),
:mod:`.run` (the registry's run). Design: docs/draft_opd.md.
"""

from __future__ import annotations

from specopd_trainer.algorithms.draft_opd.config import DraftOPDConfig
from specopd_trainer.algorithms.registry import Algorithm, lazy_adapt, lazy_run, register

ALGORITHM = register(Algorithm(
    name="draft-opd",
    title="Draft-OPD",
    help="Draft-OPD: rollouts through the server's draft-and-verify loop, the drafter replayed at the blocks with a "
         "rejection, forward KL on accepted slots and gamma-weighted reverse KL on rejected ones.\n\n"
         "Needs --admin-key. With --from-traffic it trains on the requests the server recorded (its traffic "
         "endpoint) instead of rolling out prompts, pushing the drafter hot while the server keeps serving. "
         "Ablations: --anchors random, --loss fkl_only|rkl_only, --no-replay. Runs under `torchrun` as DDP or FSDP2 "
         "(--parallel): each rank rolls out its share of the step's prompts, rank 0 pushes (--from-traffic: single "
         "process only).",
    config=DraftOPDConfig,
    run=lazy_run("specopd_trainer.algorithms.draft_opd.run:run"),
    recipe={},
    data="prompts",
    needs_push=True,
    version_prefix="draftopd",
    flags={"warmup_steps": "--warmup"},
    adapt=lazy_adapt("specopd_trainer.algorithms.draft_opd.adapt:make_step"),
))

__all__ = ["ALGORITHM", "DraftOPDConfig"]
