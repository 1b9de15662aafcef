"""Why does speculative decoding lose on this CPU: what does a verify forward of m tokens cost against a decode forward, and at which tau would a served step break even?

Command: ``python benchmarks/verify_cost/run.py [--rows 1,2,4,8]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/verify_cost_smollm2_cpu.json``.
Runtime: a few minutes (no server).
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
