"""The in-server plugin: everything that runs inside SGLang's processes.

Entry point :func:`sglang_specopd.server.plugin.register` (group ``sglang.srt.plugins``). It imports the wire
protocol and the kernels, never the trainer or the app; :mod:`.cpu` is reached only from :mod:`.plugin`
(enforced by ``.importlinter``).
"""
