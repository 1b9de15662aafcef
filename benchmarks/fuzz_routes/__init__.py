"""Does every plugin route answer hostile and random requests with a 2xx/4xx, never a 5xx, reset or hang?

Command: ``python benchmarks/fuzz_routes/run.py --examples 10000`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/fuzz_routes_cpu.json``.
Runtime: minutes (wall_s 162 s for 10,000 examples).

The runner ``run.py``; the route strategies (:mod:`.strategies`); the crafted hostile kinds (:mod:`.crafted`, which
imports :mod:`.strategies`, never the reverse). ``tests/test_fuzz_routes.py`` runs the same strategies.
"""
