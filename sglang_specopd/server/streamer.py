"""Carries SPECOPD acceptance traces from the scheduler into each response's ``meta_info``.

Uses SGLang's own extension point for extra per-request output (``SchedulerOutputStreamer``'s
``has_additional_customized_info`` / ``build_additional_customized_info``); the tokenizer manager appends each
step's records to ``meta_info["specopd_trace"]`` (only for requests that asked) and the drafter versions that
proposed for the request to ``meta_info["specopd_drafter_versions"]`` (always, on speculative servers) and, under the
goodput policy, the number of drafts each verify step checked to ``meta_info["specopd_verify_k"]``. On a
server that records live traffic, each finished request is also put into the traffic spool here
(:func:`sglang_specopd.server.traffic.spool.record_finished`; its trace stays in the scheduler unless the request asked).
"""

from __future__ import annotations

from sglang_specopd.server import compat, metrics
from sglang_specopd.server.traces import (TRACE_KEY, VERSIONS_KEY, has_pending_verify_k, take_pending,
                                          take_pending_verify_k, take_pending_versions, wants_trace)
from sglang_specopd.server.traffic.spool import record_finished, spool
from sglang_specopd.wire.policy import VERIFY_K_KEY


def _make_streamer_class():
    SchedulerOutputStreamer = compat.get("SchedulerOutputStreamer")

    class SpecOPDOutputStreamer(SchedulerOutputStreamer):
        has_additional_customized_info = True

        def should_build_additional_customized_info(self) -> bool:
            return self.spec_algorithm.is_speculative()

        def build_additional_customized_info(self, reqs):
            out = {VERSIONS_KEY: [take_pending_versions(r) for r in reqs]}
            if any(wants_trace(r) for r in reqs):
                out[TRACE_KEY] = [take_pending(r) for r in reqs]
            if any(has_pending_verify_k(r) for r in reqs):  # the goodput policy's k per verify step
                out[VERIFY_K_KEY] = [take_pending_verify_k(r) for r in reqs]
            if record_finished(reqs):
                metrics.set_spool_bytes(spool().bytes)  # the spool's gauge (docs/metrics.md)
            return out

    return SpecOPDOutputStreamer


_STREAMER = None


def get_output_streamer_class(self):
    """REPLACE hook for ``Scheduler.get_output_streamer_class``."""
    global _STREAMER
    if _STREAMER is None:
        _STREAMER = _make_streamer_class()
    return _STREAMER
