"""Train commands on the app side: options, data, and the session that pushes drafters to a server or a fleet.

:mod:`.commands` runs ``specopd train <algorithm>``, :mod:`.options` and :mod:`.data` turn CLI flags into the
trainer's configs and records, :mod:`.session` is the push session for one server and :mod:`.fleet_session` its
fleet variant.
May import the trainer (:mod:`specopd_trainer`), :mod:`sglang_specopd.app.fleet` (a fleet's run directory),
app leaf modules and the wire protocol; never the CLI.
"""
