"""How much faster is one score_trees forward than stock SGLang scoring every branch, and is it exact?

Command: ``python benchmarks/tree_scoring/run.py [--target smollm2|tiny-qwen3next|tiny-qwen4exp-sparse] [--repeats 2]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/tree_scoring_cpu.json, tree_scoring_gdn_cpu.json, tree_scoring_qsa_cpu.json``.
Runtime: minutes per target.
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
