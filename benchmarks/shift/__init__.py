"""When traffic shifts to new domains, which `specopd adapt` algorithm gains most on them without forgetting the old ones?

Command: ``python benchmarks/shift/run.py [--shift-minutes 30]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/traffic_shift_smollm2_cpu.json (+ .png)``.
Runtime: --shift-minutes per arm plus evaluation (hours).

Pieces of ``benchmarks/shift/run.py``: one
arm against its own server (:mod:`.arm`), measurements (:mod:`.measure`), the cost of capturing features while
serving (:mod:`.feature_cost`), the result (:mod:`.result`) and its plot (:mod:`.plot`).
"""
