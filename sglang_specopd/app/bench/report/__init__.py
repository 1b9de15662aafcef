"""``specopd bench report``: one markdown report (+ PNG plots) from the result files in ``benchmarks/results/``.

:mod:`.build` assembles the report, :mod:`.summary` (+ :mod:`.summary_opd`) the results summary that ``--readme``
writes into README.md (:mod:`.readme`); the other modules each render one section (serving, headline, adapt,
archs, fleet, plots).
May import :mod:`sglang_specopd.app.results`, :mod:`sglang_specopd.app.bench` and :mod:`specopd_kernels.verified`;
nothing that starts a server.
"""
