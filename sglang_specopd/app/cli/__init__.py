"""The ``specopd`` command line: one module per subcommand group, all attached to the apps in :mod:`.apps`.

:func:`main` (from :mod:`.entry`) is the console-script entry point (``specopd = sglang_specopd.app.cli:main``, and
``python -m sglang_specopd.app.cli``); each other module adds its commands and imports its heavy dependencies
lazily, so ``specopd --help`` stays fast.
May import every other app package (serve, train, fleet, main_job, bench, drafters, ...); nothing imports it.
"""

from sglang_specopd.app.cli.entry import main  # noqa: F401,E402  (the console script's target)
