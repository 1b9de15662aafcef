"""Does Draft-OPD beat continued SFT from the same start at equal supervised tokens (paired held-out tau intervals)?

Command: ``python benchmarks/draft_opd_compare/run.py [--arms ...] [--lr 3e-5]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/draft_opd_smollm2_cpu.json, draft_opd_lr3e-5_smollm2_cpu.json, draft_opd_sweep_lr*_smollm2_cpu.json (+ .png)``.
Runtime: hours on a 2-core CPU (arms resume from the run directory).

Helpers of ``benchmarks/draft_opd_compare/run.py``: the arms and their budgets (:mod:`.arms`), per-arm results kept
in the run directory and their merge into one result with intervals (:mod:`.store`), training one arm against the
live server (:mod:`.train`), the plot (:mod:`.plot`).
"""
