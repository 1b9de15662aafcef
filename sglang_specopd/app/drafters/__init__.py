"""Drafter checkpoints on the app side: check one, push one to a server, the shipped reference drafters.

:mod:`.check` validates a checkpoint against a target, :mod:`.push` sends one to a running server (swap or
stage/commit), :mod:`.reference` finds the trained reference drafters shipped in ``sglang_specopd/assets``.
May import the wire protocol, the trainer's client and pipeline, and :mod:`sglang_specopd.app` leaf modules.
"""
