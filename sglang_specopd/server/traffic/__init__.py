"""Served traffic kept for training: the opt-in, byte-bounded spool of request traces and target features.

:mod:`.spool` is the live-traffic spool (traces, admin key to read), :mod:`.features` the target context features
captured beside it, :mod:`.optout` which requests neither keeps (``specopd_spool: false``).
May import :mod:`sglang_specopd.server.compat`, :mod:`sglang_specopd.server.control`,
:mod:`sglang_specopd.server.traces` and the wire protocol; never ``sglang`` directly.
"""
