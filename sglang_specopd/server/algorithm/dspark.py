"""The SPECOPD_DSPARK speculative algorithm: SGLang's DSpark worker plus per-request acceptance traces.

Registered with ``SpeculativeAlgorithm.register("SPECOPD_DSPARK", ...)`` by :func:`register_dspark_algorithm`. It
is to DSpark drafters (``DSparkDraftModel``) what SPECOPD (:mod:`sglang_specopd.server.algorithm.specopd`) is to DFlash /
DFlash V2 ones. To SGLang it is the DSPARK algorithm: every ``is_*`` / ``supports_*`` question is answered as
``SpeculativeAlgorithm.DSPARK`` answers it (``make_spec_class("DSPARK")``), and its server-argument resolution is
DSPARK's own ``_handle_dspark`` (gamma from ``--speculative-dspark-block-size`` or the drafter's
``dflash_config.block_size``, verify window gamma + 1), run by an AFTER hook on ``handle_speculative_decoding``
exactly as SPECOPD runs ``_handle_dflash``. ``_handle_dspark`` reads no algorithm name, and on the CPU engine the
call goes through CPU adaptation 16's AROUND hook (:mod:`sglang_specopd.server.cpu.dspark`, the device gate),
since ``compat.get`` returns the hooked module attribute.

The worker subclasses ``DSparkWorkerV2`` and changes nothing it computes: drafting (the Markov-head walk, sampled
at temperature > 0 from the q that ``accept_sampling`` then verifies against, lossless), verification and
commits are SGLang's. It only observes each verify step, at the one call every decode path of
``DSparkWorkerV2._forward_decode`` makes after the accept (``self._observers.observe_verify_step``, which receives
the batch's requests, the prefix lengths, the proposed ``draft_tokens [bs, gamma]`` and the accepted
``correct_len [bs]``; the step commits ``correct_len + 1`` tokens): the worker's observer facade is wrapped by
:class:`_TracingObservers`, which records the same per-request records as SPECOPD (anchor = prefix length, the
gamma proposed tokens, the accepted count, the drafter version; :mod:`sglang_specopd.server.traces`, kept for every
request when the live-traffic spool is on, :mod:`sglang_specopd.server.traffic.spool`) and the drafter versions each
request saw, then forwards the call to SGLang's observers unchanged.

Hot swap (:mod:`sglang_specopd.server.drafter.swap`) reaches the draft model as ``worker.draft_model`` (DSparkWorkerV2
sets it) and clears the draft model's caches of pre-stacked context-KV weights after loading.

Not covered: SGLang configurations gated on the literal name ``"DSPARK"`` (DeepSeek-V4 / MiniMax DSpark drafts,
unified memory, pipeline-parallel PD prefill, KDA replay-SSM, DP prefill coordination) see ``SPECOPD_DSPARK``
as another algorithm there; the dense ``DSparkDraftModel`` path served here does not reach them.
"""

from __future__ import annotations

import logging

from sglang_specopd.server import compat
from sglang_specopd.server import metrics
from sglang_specopd.server.algorithm.specopd import make_spec_class

logger = logging.getLogger("sglang_specopd.server.algorithm.dspark")

DSPARK_ALGORITHM_NAME = "SPECOPD_DSPARK"


class _TracingObservers:
    """Stands in for a ``DsparkStepObservers``: ``observe_verify_step`` records the step's traces, then calls
    SGLang's; every other attribute is the wrapped observers'."""

    __slots__ = ("_inner", "_record")

    def __init__(self, inner, record):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_record", record)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_inner"), name)

    def observe_verify_step(self, **kwargs):
        object.__getattribute__(self, "_record")(kwargs["reqs"], kwargs["bs"], kwargs["prefix_lens"],
                                                 kwargs["draft_tokens"], kwargs["correct_len"])
        return object.__getattribute__(self, "_inner").observe_verify_step(**kwargs)


def record_dspark_step(reqs, bs: int, prefix_lens, draft_tokens, correct_len, *, keep_all: bool) -> None:
    """Record one DSpark verify step for ``reqs`` (row-aligned, ``bs`` rows): the drafter version for every
    request, and (for requests that asked, or all with ``keep_all``) the trace record ``{anchor: prefix_lens[i],
    proposed: draft_tokens[i], accepted: correct_len[i], drafter_version}``."""
    from sglang_specopd.server.drafter.swap import current_version
    from sglang_specopd.server.traces import record_verify_step, record_versions, wants_trace

    reqs = list(reqs or ())[: int(bs)]
    if not reqs:
        return
    version = current_version()  # swaps run between batches: the version whose weights drafted this block
    record_versions(reqs, version)
    if metrics.enabled():  # Prometheus counters (docs/metrics.md)
        metrics.record_verify(correct_len[: len(reqs)].tolist(), [len(p) for p in draft_tokens[: len(reqs)].tolist()])
    if keep_all or any(wants_trace(r) for r in reqs):
        record_verify_step(reqs, prefix_lens[: len(reqs)].tolist(), draft_tokens[: len(reqs)].tolist(),
                           correct_len[: len(reqs)].tolist(), version, keep_all=keep_all)


def _make_worker_class():
    from sglang_specopd.server.traffic.spool import recording

    DSparkWorkerV2 = compat.get("DSparkWorkerV2")
    keep_all = recording()  # live-traffic spool on: every request's verify records are kept (server/traffic/spool.py)

    def record(reqs, bs, prefix_lens, draft_tokens, correct_len):
        record_dspark_step(reqs, bs, prefix_lens, draft_tokens, correct_len, keep_all=keep_all)

    class SpecOPDDSparkWorker(DSparkWorkerV2):
        """``DSparkWorkerV2`` that records (anchor, proposed tokens, accepted count, drafter version) per verify
        step; drafting and verification are SGLang's."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            observers = vars(self).get("_observers")  # absent on pipeline stages that host no draft
            if observers is not None:
                self._observers = _TracingObservers(observers, record)

    return SpecOPDDSparkWorker


def resolve_specopd_dspark_server_args(result, server_args):
    """AFTER hook on ``handle_speculative_decoding``: give SPECOPD_DSPARK the DSPARK resolution (gamma, verify
    window, steps / top-k; on the CPU engine through CPU adaptation 16's hook)."""
    if (compat.get("resolving_view")(server_args).speculative_algorithm or "").upper() == DSPARK_ALGORITHM_NAME:
        compat.get("_handle_dspark")(server_args)
    return result


def register_dspark_algorithm() -> None:
    """Register ``SPECOPD_DSPARK`` with SGLang (idempotent per process)."""
    if compat.get("get_spec")(DSPARK_ALGORITHM_NAME) is not None:
        return
    spec_class = make_spec_class("DSPARK")

    @compat.get("SpeculativeAlgorithm.register")(DSPARK_ALGORITHM_NAME, supports_overlap=True, spec_class=spec_class)
    def _factory(server_args):
        return _make_worker_class()

    compat.hook("handle_speculative_decoding", resolve_specopd_dspark_server_args)
