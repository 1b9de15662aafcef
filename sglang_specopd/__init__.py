"""sglang-specopd: an SGLang plugin that serves DFlash-family drafters and supports on-policy distillation.

Importing this package is cheap: it imports neither torch nor sglang. The SGLang plugin entry point is
:func:`sglang_specopd.server.plugin.register` (entry-point group ``sglang.srt.plugins``).
"""

__version__ = "0.1.0"
