"""Carries SPECOPD acceptance traces from the scheduler into each response's ``meta_info``.

Uses SGLang's own extension point for extra per-request output (``SchedulerOutputStreamer``'s
``has_additional_customized_info`` / ``build_additional_customized_info``); the tokenizer manager appends each
step's records to ``meta_info["specopd_trace"]``.
"""

from __future__ import annotations

from sglang_specopd.traces import TRACE_KEY, take_pending, wants_trace


def _make_streamer_class():
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

    class SpecOPDOutputStreamer(SchedulerOutputStreamer):
        has_additional_customized_info = True
        _specopd_reqs_this_call = ()

        def _stream_output_generation(self, reqs, return_logprob, skip_req=None, is_idle_batch=False):
            # Only build the extra field when some request in this batch asked for a trace.
            SpecOPDOutputStreamer._specopd_reqs_this_call = reqs
            try:
                return super()._stream_output_generation(reqs, return_logprob, skip_req, is_idle_batch)
            finally:
                SpecOPDOutputStreamer._specopd_reqs_this_call = ()

        def should_build_additional_customized_info(self) -> bool:
            return any(wants_trace(r) for r in SpecOPDOutputStreamer._specopd_reqs_this_call)

        def build_additional_customized_info(self, reqs):
            return {TRACE_KEY: [take_pending(r) for r in reqs]}

    return SpecOPDOutputStreamer


_STREAMER = None


def get_output_streamer_class(self):
    """REPLACE hook for ``Scheduler.get_output_streamer_class``."""
    global _STREAMER
    if _STREAMER is None:
        _STREAMER = _make_streamer_class()
    return _STREAMER
