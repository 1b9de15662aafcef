"""Tiny random-initialised targets built on demand (``specopd models prepare``), for CPU tests and benchmarks.

:mod:`.hybrid` is a Qwen3-Next-style hybrid Gated DeltaNet target, :mod:`.qsa` a Qwen4-exp-style QSA target;
:mod:`sglang_specopd.app.models` names them and imports them lazily.
May import torch/transformers and :mod:`sglang_specopd.wire`; nothing else of the app.
"""
