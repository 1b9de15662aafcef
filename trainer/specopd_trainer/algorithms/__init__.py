"""Training algorithms, one package each (:mod:`.sft`, :mod:`.specopd`, :mod:`.sequential_opd`), found through the
registry (:mod:`.registry`: name -> config model, recipe, run function, data it trains on). Shared loop machinery
(engine, counters, progress, branch trees, target head) lives in :mod:`specopd_trainer.loops`."""

from specopd_trainer.algorithms.registry import (Algorithm, AlgorithmError, RunReport, TrainContext,
                                                 UnknownAlgorithmError, algorithms, get, names, register, unregister)

__all__ = ["Algorithm", "AlgorithmError", "RunReport", "TrainContext", "UnknownAlgorithmError", "algorithms", "get",
           "names", "register", "unregister"]
