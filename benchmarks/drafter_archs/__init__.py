"""DFlash vs DFlash V2 vs DSpark on SmolLM2: SFT and SpecOPD served tau at equal budgets, paired.

Command: ``python benchmarks/drafter_archs/run.py [--archs dflash,dflash2,dspark]`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/drafter_archs_smollm2_cpu.json (+ .png)``.
Runtime: hours on a 2-core CPU (phases resume; the script prints an ETA).

Helpers of ``benchmarks/drafter_archs/run.py``: the phases of each drafter architecture and their run
directory (:mod:`.store`), the training data (:mod:`.data`), the phases themselves (:mod:`.phases`), progress and
ETA (:mod:`.eta`), the merge into the result with intervals and paired differences (:mod:`.merge`) and its plot
(:mod:`.plot`).
"""
