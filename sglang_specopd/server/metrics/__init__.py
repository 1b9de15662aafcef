"""Prometheus metrics of the plugin, on SGLang's own ``/metrics`` (``--enable-metrics``): docs/metrics.md.

:mod:`.series`: the table of series; :mod:`.recorder`: the collectors and the calls the plugin's modules make
(``record_verify``, ``record_policy_k``, ``set_drafter_version``, ``record_control_op``, ``set_spool_bytes``);
:mod:`.hooks`: turning recording on in SGLang's processes, the score_trees wrapper. This package imports only
:mod:`sglang_specopd.server.compat` and the wire protocol of the plugin (the plugin's other modules import it).
"""

from sglang_specopd.server.metrics.recorder import (  # noqa: F401
    enabled,
    record_control_op,
    record_policy_k,
    record_verify,
    set_drafter_version,
    set_spool_bytes,
)
