"""Helpers of ``benchmarks/draft_opd_smollm2.py``: the arms and their budgets (:mod:`.arms`), per-arm results kept
in the run directory and their merge into one result with intervals (:mod:`.store`), training one arm against the
live server (:mod:`.train`), the plot (:mod:`.plot`)."""
