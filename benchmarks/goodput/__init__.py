"""Does the goodput speculative policy beat the fixed block and plain serving (throughput, paired intervals), per temperature and concurrency?

Command: ``python benchmarks/goodput/run.py --drafter DIR [--concurrency 1,2,4,8]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/goodput_smollm2_cpu.json``.
Runtime: not recorded in the file; three servers, every held-out prompt per level.
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
