"""Does the goodput speculative policy beat the fixed block and plain serving (throughput, paired intervals), per temperature and concurrency?

Command: ``python benchmarks/goodput/run.py --drafter DIR [--concurrency 1,2,4,8]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/goodput_smollm2_<machine kind>.json`` (one per kind, e.g.
``goodput_smollm2_epyc-avx512-bf16.json``; ``goodput_smollm2_cpu.json``: the Xeon AVX-512 bf16 run of 2026-12-05).
Runtime: about an hour on a 2-core CPU at the defaults (three servers up, every held-out prompt per level).
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
