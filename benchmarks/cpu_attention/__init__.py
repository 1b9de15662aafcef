"""How much does the batched CPU attention (server/cpu/batched_attention.py) speed up plain and SPECOPD serving over SGLang's per-request loop?

Command: ``python benchmarks/cpu_attention/run.py [--concurrency 1,8,32] [--limit 8]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/cpu_attention_smollm2_cpu.json``.
Runtime: not recorded in the file; two `bench serve` runs.
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
