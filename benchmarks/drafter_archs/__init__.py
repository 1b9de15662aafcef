"""Helpers of ``benchmarks/drafter_archs_smollm2.py``: the phases of each drafter architecture and their run
directory (:mod:`.store`), the training data (:mod:`.data`), the phases themselves (:mod:`.phases`), progress and
ETA (:mod:`.eta`), the merge into the result with intervals and paired differences (:mod:`.merge`) and its plot
(:mod:`.plot`)."""
