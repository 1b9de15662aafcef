"""Trainable drafters whose ``state_dict`` is the SGLang checkpoint format; one registry (:mod:`.registry`).

Import the heavy modules (torch) on demand: ``from specopd_trainer.drafters.dflash import DFlashDrafter`` or
``get_drafter_class("dflash")``.
"""

from specopd_trainer.drafters.registry import (
    DRAFTERS,
    UnknownDrafterError,
    drafter_class_for_checkpoint,
    drafter_names,
    get_drafter_class,
    register_drafter,
)

__all__ = ["DRAFTERS", "UnknownDrafterError", "drafter_class_for_checkpoint", "drafter_names", "get_drafter_class",
           "register_drafter"]
