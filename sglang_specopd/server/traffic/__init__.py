"""Served traffic kept for training: the opt-in, byte-bounded spool of request traces and target features.

:mod:`.spool` is the live-traffic spool (traces, admin key to read), :mod:`.features` the target context features
captured beside it.
May import :mod:`sglang_specopd.server.compat`, :mod:`sglang_specopd.server.control`, the wire protocol and the
kernels; never ``sglang`` directly.
"""
