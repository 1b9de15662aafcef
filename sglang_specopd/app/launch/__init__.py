"""Start, health-check and stop a real SGLang server with the plugin loaded.

:mod:`.process` runs ``python -m sglang.launch_server`` in its own process group, :mod:`.cleanup` reaps what
a dead launch leaves behind, :mod:`.pinning` writes core lists and pins a command to cores.
May import :mod:`sglang_specopd.server.plugin` (the launch environment), the plugin's scoring defaults and the
wire protocol; nothing of the app.
"""
