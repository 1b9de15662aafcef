"""Does serving stay healthy (no 5xx, bounded ITL, RSS flat) beside a live SpecOPD trainer and a malformed-request fuzzer?

Command: ``python benchmarks/soak/run.py --minutes 20 [--curve-budgets 256,1024,0]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/live_training_soak_cpu.json (+ .png)``.
Runtime: --minutes plus the idle phase and the curve (wall_s 1988 s for 20 minutes).

Helpers of ``benchmarks/soak/run.py``: result statistics (``stats``), the malformed-request fuzzer
(``fuzz``), the status-counting proxy in front of the trainer (``proxy``) and the processes of a soak: load
streams, RSS sampling, CPU pinning and the trainer subprocess (``procs``).
"""
