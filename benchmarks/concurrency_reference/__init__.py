"""Does serving with the shipped reference drafter beat plain serving on the CPU default, at concurrency 1/2/4/8, T=0 and T=1?

Command: ``python benchmarks/concurrency_reference/run.py [--temperatures 0,1] [--max-new-tokens 64]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/concurrency_reference_smollm2_cpu.json (+ .png)``.
Runtime: not recorded in the file; two `specopd bench serve` runs (one per temperature) of 24 prompts per domain.
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
