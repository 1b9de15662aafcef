"""Wire protocol: what the trainer and the in-server plugin agree on, and nothing else.

The ``/specopd/*`` request and response models and their binary tensor codec (:mod:`.protocol`), the drafter
checkpoint formats SGLang loads (the registry of drafter architectures :mod:`.drafter_archs`, DFlash's format
:mod:`.drafter_format` + :mod:`.drafter_dflash`, creation :mod:`.drafter_init`), reading a target checkpoint's
config and safetensors headers (:mod:`.checkpoint_info`) and where prepared files live (:mod:`.home`).
Imports only :mod:`specopd_kernels` below it (enforced by ``.importlinter``); never SGLang.
"""
