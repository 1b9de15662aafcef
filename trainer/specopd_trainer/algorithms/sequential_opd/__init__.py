"""Sequential-rollout OPD: the baseline SpecOPD replaces (same tree loss, supervision from real rollouts).

Each step pushes the drafter, rolls prompts out through the server's draft-and-verify loop (on-policy) and trains
on the recorded blocks (E2E-TV). Modules: :mod:`.config`, :mod:`.rollouts` (rollouts and their loss),
:mod:`.loop` (:func:`train_sequential_opd`), :mod:`.run` (the registry's run).
"""

from __future__ import annotations

from specopd_trainer.algorithms.registry import Algorithm, lazy_run, register
from specopd_trainer.algorithms.sequential_opd.config import SequentialOPDConfig



ALGORITHM = register(Algorithm(
    name="sequential-opd",
    title="sequential OPD",
    help="Sequential-rollout OPD (the baseline): each step pushes the drafter, rolls out prompts through the "
         "server's draft-and-verify loop (on-policy) and trains on the recorded blocks (E2E-TV).\n\n"
         "Needs --admin-key. With a domain list, prompts come from the domains' train split (no responses are "
         "generated). Single process (not under torchrun).",
    config=SequentialOPDConfig,
    run=lazy_run("specopd_trainer.algorithms.sequential_opd.run:run"),
    recipe={},
    data="prompts",
    needs_push=True,
    distributed=False,
    version_prefix="seqopd",
    flags={"warmup_steps": "--warmup"},
))

__all__ = ["ALGORITHM", "SequentialOPDConfig"]
