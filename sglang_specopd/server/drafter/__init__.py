"""The serving drafter's lifecycle inside the server: swap, stage/commit/abort (rollout), info.

:mod:`.swap` is the validated one-phase hot swap (scheduler side), :mod:`.txn` the staged drafter of a rollout
transaction (state only), :mod:`.rollout` the two-phase ops on it, :mod:`.routes` and :mod:`.rollout_routes`
their HTTP handlers (``/specopd/drafter*``).
May import :mod:`sglang_specopd.server.compat`, :mod:`sglang_specopd.server.control`,
:mod:`sglang_specopd.server.http`, :mod:`sglang_specopd.server.target_identity` and the wire protocol; never ``sglang``.
"""
