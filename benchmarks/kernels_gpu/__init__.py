"""Does every kernel match its plain-torch reference on a GPU, and how fast is it? Writes the verified-kernel records.

Command: ``python benchmarks/kernels_gpu/run.py --all (on a GPU; --small on CPU under the Triton interpreter)`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/kernels_gpu.json and kernels/specopd_kernels/verified_kernels.json``.
Runtime: under 8 minutes on one H200 for the full grid (section_wall_s in the file).
The script is ``run.py`` beside this file; its docstring says how it measures.
"""
