"""The in-server plugin: everything that runs inside SGLang's processes.

Entry point :func:`sglang_specopd.server.plugin.register` (group ``sglang.srt.plugins``). It imports the wire
protocol and the kernels, never the trainer or the app; :mod:`.cpu` is reached only from :mod:`.plugin`
(enforced by ``.importlinter``). Every SGLang symbol the plugin reads, subclasses, hooks or patches is named in
:mod:`.compat` and obtained through it (no other plugin module imports ``sglang``, also enforced by
``.importlinter``); ``register()`` first checks that the installed SGLang still has all of them
(:mod:`.compat.check`).
"""
