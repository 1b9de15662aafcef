"""How much does SFT on target responses from a live server raise served tau over a fresh drafter?

Command: ``python benchmarks/sft_smollm2/run.py [--minutes 30] [--per-domain 100]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/sft_smollm2_cpu.json, sft_smollm2_big_cpu.json (+ .png)``.
Runtime: --minutes of training (wall_s 1807 s in sft_smollm2_cpu.json) plus data and evaluation.
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
