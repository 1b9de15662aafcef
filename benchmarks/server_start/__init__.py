"""How long a CPU server takes from launch to healthy: SGLang's spawn start against the plugin's fork start (CPU adaptation 17).

Command: ``python benchmarks/server_start/run.py [--rounds 3]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/server_start_smollm2_<machine kind>.json``.
Runtime: ~6 min on 2 cores at the defaults (six server starts).
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
