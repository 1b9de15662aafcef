"""The speculative algorithms the plugin registers with SGLang.

:mod:`.specopd` is SPECOPD (SGLang's DFlash worker plus per-request acceptance traces and the goodput policy),
:mod:`.dspark` its DSpark-drafter variant.
May import :mod:`sglang_specopd.server.compat` (every SGLang class they subclass), the other plugin packages
(traces, goodput, scoring, traffic, drafter), the wire protocol and the kernels; never ``sglang`` directly.
"""
