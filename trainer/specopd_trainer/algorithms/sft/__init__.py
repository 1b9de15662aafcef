"""SFT: the DFlash drafter on the target's own responses, loss ``ce_decay`` (the baseline SpecOPD starts from).

Modules: :mod:`.config` (:class:`SFTConfig`), :mod:`.loop` (:func:`train_sft`), :mod:`.run` (the registry's run).
"""

from __future__ import annotations

from specopd_trainer.algorithms.registry import Algorithm, lazy_adapt, lazy_run, register
from specopd_trainer.algorithms.sft.config import SFTConfig



ALGORITHM = register(Algorithm(
    name="sft",
    title="SFT",
    help="SFT on the target's own responses (loss ce_decay); the trained drafter is pushed hot at the end.\n\n"
         "Runs under `torchrun` as DDP, or FSDP2 with --parallel fsdp2 (drafter sharded; the single-process "
         "batch split across ranks).",
    config=SFTConfig,
    run=lazy_run("specopd_trainer.algorithms.sft.run:run"),
    recipe={},  # SFT runs on its config defaults
    data="sequences",
    flags={"anchors_per_seq": "--anchors", "warmup_steps": "--warmup"},
    adapt=lazy_adapt("specopd_trainer.algorithms.sft.adapt:make_step"),
))

__all__ = ["ALGORITHM", "SFTConfig"]
