"""``python -m sglang_specopd.app.cli``: the same command line as the ``specopd`` console script."""

from sglang_specopd.app.cli import main

main()
