"""Drafter checkpoint formats SGLang loads, shared by the trainer, the app and the server hot-swap.

:mod:`.archs` is the registry of drafter architectures; :mod:`.format`, :mod:`.dflash`, :mod:`.dflash2` and
:mod:`.dspark` are the per-architecture formats; :mod:`.layouts` their tensor layouts; :mod:`.init` creates a
checkpoint for a target; :mod:`.sglang_dflash` and :mod:`.sglang_dspark` mirror how SGLang reads their config.json.
May import the rest of :mod:`sglang_specopd.wire` and :mod:`specopd_kernels`; never SGLang, the trainer or the app.
"""
