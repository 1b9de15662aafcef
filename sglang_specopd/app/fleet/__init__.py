"""``specopd fleet``: N SPECOPD workers from one server config behind the ``sglang-router``.

:mod:`.supervisor` starts, watches and stops a fleet, :mod:`.plan` plans ports and cores, :mod:`.router` runs the
router, :mod:`.state` / :mod:`.status` keep and report the fleet's state, :mod:`.control` runs the supervisor
as a detached process.
May import :mod:`sglang_specopd.app.serve.spec`, :mod:`sglang_specopd.app.launch.process`, app leaf modules, the trainer's
fleet client and the wire protocol; never the CLI or the train commands.
"""
