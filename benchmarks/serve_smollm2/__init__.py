"""Is SPECOPD's greedy output identical to plain serving on SmolLM2 (float32), and how fast are both?

Command: ``python benchmarks/serve_smollm2/run.py [--max-new-tokens 64]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/serve_smollm2_cpu.json``.
Runtime: minutes (four servers started in turn).
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
