"""Where does on-policy distillation (SpecOPD, Draft-OPD, a T=0-aligned objective) beat continued SFT, from an SFT
start that has plateaued, at matched wall clock (issue 52)?

Command: ``python benchmarks/opd_regimes/run.py [--regimes a,b,c,d,e] [--seeds 0,1] [--quick]`` (from the repository
root; ``--help`` lists every option).
Result: ``benchmarks/results/opd_regimes_smollm2_cpu.json (+ .png)``.
Runtime: hours on a 2-core CPU (each arm checkpointed in its run directory; a rerun skips finished arms);
``--quick`` about 20 minutes (tiny budgets, few prompts, one seed), every arm of every regime.

Pieces of ``benchmarks/opd_regimes/run.py``: the regimes and the arms (:mod:`.regimes`), the SFT-from-traffic phase
that runs until the held-out gain plateaus and leaves the snapshot (:mod:`.plateau`), one arm from a snapshot with
its counters and served tau (:mod:`.arms`), the result with paired intervals (:mod:`.result`) and its plot
(:mod:`.plot`). Served traffic, held-out buffers, the guard's greedy walk and the training steps are
``specopd adapt``'s own (:class:`specopd_trainer.adapt.loop.Adapter`); held-out prompts and served tau come from the
traffic-shift benchmark (:mod:`shift.measure`).
"""
