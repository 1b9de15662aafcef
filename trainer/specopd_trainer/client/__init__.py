"""The trainer's way to reach served targets over HTTP.

:mod:`.http` is the typed client for one live sglang-specopd server (retries, backoff, 429 handling);
:mod:`.pool` spreads ``generate`` calls over several replicas of one target.
May import :mod:`sglang_specopd.wire` and :mod:`specopd_kernels`; never SGLang, the plugin or the app.
"""
