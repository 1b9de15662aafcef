"""Wire protocol: what the trainer and the in-server plugin agree on, and nothing else.

The ``/specopd/*`` request and response models and their binary tensor codec (:mod:`.protocol`), the drafter
checkpoint formats SGLang loads (the registry of drafter architectures :mod:`.drafters.archs`, DFlash's format
:mod:`.drafters.format` + :mod:`.drafters.dflash`, creation :mod:`.drafters.init`), reading a target checkpoint's
config and safetensors headers (:mod:`.checkpoint_info`) and where prepared files live (:mod:`.home`).
Imports only :mod:`specopd_kernels` below it (enforced by ``.importlinter``); never SGLang.
"""
