"""SpecOPD vs continued SFT vs sequential-rollout OPD at equal supervised-token budgets, redeployed hot: tau and supervised tokens/s.

Command: ``python benchmarks/specopd_smollm2/run.py [--sequential-max-minutes 15]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/specopd_smollm2_cpu.json (+ .png)``.
Runtime: hours on a 2-core CPU (the sequential arm is capped by --sequential-max-minutes).
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
