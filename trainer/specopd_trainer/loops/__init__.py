"""Machinery the training algorithms (:mod:`specopd_trainer.algorithms`) share: the engine (:mod:`.engine`:
optimiser, schedule, time budget, checkpoints, resume), its progress bar (:mod:`.progress`), LR / anchors / tau
helpers (:mod:`.common`), cumulative supervision counters (:mod:`.counters`), proposal-tree packing of branches
(:mod:`.branch_tree`) and the frozen target head (:mod:`.head`)."""
