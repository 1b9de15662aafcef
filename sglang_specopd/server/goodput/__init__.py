"""The goodput policy: how many of a block's drafts each SPECOPD step verifies, and its runtime control.

:mod:`.policy` is the pure maths (per-slot acceptance -> k), :mod:`.step` runs it in the scheduler's step,
:mod:`.verify` the k-row target verify, :mod:`.plain` a k = 0 step as plain decode (and the drafter's
context caught up), :mod:`.control` the ``/specopd/goodput`` admin handlers.
May import :mod:`sglang_specopd.server.compat`, :mod:`sglang_specopd.server.control`, :mod:`sglang_specopd.server.http`,
the plugin's leaf modules (traces, sampled drafts) and the wire protocol; never ``sglang`` directly.
"""
