"""Training loops: SFT (:mod:`.sft`); SpecOPD, sequential OPD and Draft-OPD loops are added beside it."""
