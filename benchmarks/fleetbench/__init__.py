"""Do 2 SPECOPD workers behind sglang-router serve and train faster than 1, and does a rollout or a kill -9 lose anything?

Command: ``python benchmarks/fleetbench/run.py --drafter DIR [--concurrency 1,16]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/fleet_smollm2_cpu.json, fleet_c16_smollm2_cpu.json (+ .png)``.
Runtime: about an hour (wall_s 3487 s in fleet_smollm2_cpu.json).

Pieces of ``benchmarks/fleetbench/run.py``: the
numbers (:mod:`.stats`, pure functions, unit-tested without servers), the versioned ``/generate`` load and the timed
rollout calls (:mod:`.load`), the fleet phases against real workers (:mod:`.phases`) and the plot (:mod:`.plot`).
"""
