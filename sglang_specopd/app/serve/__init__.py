"""From a server config to a running SGLang server with the plugin (``specopd serve``, ``--dry-run``).

:mod:`.choice` decides which drafter serves and why (one function, entered once per command), :mod:`.spec`
resolves the target, validates the drafter and ports and builds the launch spec, :mod:`.dry_run` and
:mod:`.dry_drafter` show what would run without starting SGLang.
May import :mod:`sglang_specopd.app.launch.process`, :mod:`sglang_specopd.app.drafters`, app leaf modules, the wire
protocol and the kernels; never the CLI, the fleet or the main job.
"""
