"""Pieces of ``benchmarks/traffic_shift.py`` (a package named ``shift`` so that it does not shadow the script): one
arm against its own server (:mod:`.arm`), measurements (:mod:`.measure`), the cost of capturing features while
serving (:mod:`.feature_cost`), the result (:mod:`.result`) and its plot (:mod:`.plot`)."""
