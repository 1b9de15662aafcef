"""The main job on the embedded default (README's first command): the shipped drafter adapts live to traffic.

:mod:`.run` prepares the target, starts the server, sends traffic and adapts the drafter; :mod:`.report` writes
its result.
May import :mod:`sglang_specopd.app.serve.spec`, :mod:`sglang_specopd.app.launch.process`, app leaf modules, the trainer and
the wire protocol; never the CLI.
"""
