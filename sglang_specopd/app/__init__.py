"""The application layer: the ``specopd`` CLI, the main job, server launching, model preparation and benchmarks.

It sits on top: it may import the trainer (:mod:`specopd_trainer`), the plugin (:mod:`sglang_specopd.server`),
the wire protocol and the kernels; nothing below imports it (enforced by ``.importlinter``).
"""
