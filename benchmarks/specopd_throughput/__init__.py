"""Where does a SpecOPD step's time go, per setting (supervised tokens/s, per-phase seconds)?

Command: ``python benchmarks/specopd_throughput/run.py --settings A=8,K=7,S=2,R=64 --steps 24`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/specopd_throughput_smollm2_cpu.json (_nocache, _before: variants)``.
Runtime: minutes per setting (--steps).
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
