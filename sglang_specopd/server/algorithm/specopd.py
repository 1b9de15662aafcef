"""The SPECOPD speculative algorithm: SGLang's DFlash worker plus per-request acceptance traces.

Registered with ``SpeculativeAlgorithm.register("SPECOPD", ...)`` by :func:`register_algorithm`. To SGLang it is
a DFLASH-family algorithm (every ``is_*`` / ``supports_*`` question is answered as DFLASH answers it), and its
server-argument resolution is DFLASH's own (``_handle_dflash``), so flags, checkpoints and performance are those
of ``--speculative-algorithm DFLASH``. The worker subclasses ``DFlashWorkerV2``, observes each verify
step to record traces (:mod:`sglang_specopd.server.traces`) and, for requests at temperature > 0, samples each draft
slot from the drafter and verifies with lossless speculative sampling (:mod:`sglang_specopd.server.sampled_drafts`; the
DFlash reference's semantics, ``SPECOPD_DRAFT_SAMPLING=greedy`` keeps DFLASH's greedy drafts). Temperature-0
requests are drafted and verified exactly as DFLASH does.

A DFlash V2 drafter (``DFlash2DraftModel``, switched on by its checkpoint like under DFLASH) is drafted by SGLang's own
candidate-selector walk (``_propose_selector_block``): at temperature > 0 each slot is drawn from q = softmax(score / T)
over its top-K candidates given the previous pick, and ``_accept_block`` verifies with that q scattered into the
vocabulary (``_selector_sampling_accept``, SGLang's ``accept_sampling``), lossless for the q served; the worker only
records traces there (``SPECOPD_DRAFT_SAMPLING`` applies to DFlash's independent slots only).

DSpark drafters (``DSparkDraftModel``) are served by the sibling algorithm SPECOPD_DSPARK
(:mod:`sglang_specopd.server.algorithm.dspark`: SGLang's DSPARK worker with the same traces), whose spec class is
:func:`make_spec_class` delegating to DSPARK; ``specopd serve`` launches it for ``speculative_algorithm: SPECOPD``
with a DSpark drafter.
"""

from __future__ import annotations

import logging

from sglang_specopd.server import compat
from sglang_specopd.server import metrics

logger = logging.getLogger("sglang_specopd.server.algorithm.specopd")

ALGORITHM_NAME = "SPECOPD"


def make_spec_class(base: str = "DFLASH"):
    """A ``CustomSpecAlgo`` subclass that answers every capability question (``is_*``, ``supports_*``, ``has_*``,
    ``need_*``, ``carries_*``, the future map, disaggregation input, draft-token widths) as the built-in
    ``SpeculativeAlgorithm.<base>`` does: ``"DFLASH"`` for SPECOPD, ``"DSPARK"`` for SPECOPD_DSPARK
    (:mod:`sglang_specopd.server.algorithm.dspark`). Server-argument resolution and the worker stay the plugin's."""
    SpeculativeAlgorithm = compat.get("SpeculativeAlgorithm")
    CustomSpecAlgo = compat.get("CustomSpecAlgo")

    builtin = getattr(SpeculativeAlgorithm, base)  # SpeculativeAlgorithm.DFLASH / .DSPARK
    own = {"is_some", "is_none", "is_speculative", "handle_server_args", "create_worker"}

    class SpecOPDAlgo(CustomSpecAlgo):
        """Spec class delegating every capability question to the built-in algorithm ``base``."""

        def __getattr__(self, name):  # enum-only attributes (carries_draft_hidden_states, need_topk, ...)
            return getattr(builtin, name)

    for name in list(vars(SpeculativeAlgorithm)):
        if name.startswith(("is_", "supports_", "has_", "need_", "carries_")) and name not in own:
            setattr(SpecOPDAlgo, name, (lambda n: lambda self, *a, **k: getattr(builtin, n)(*a, **k))(name))
    for name in ("create_future_map", "build_disagg_draft_input", "resolve_max_speculative_num_draft_tokens",
                 "get_num_tokens_per_req_for_target_verify"):
        setattr(SpecOPDAlgo, name, (lambda n: lambda self, *a, **k: getattr(builtin, n)(*a, **k))(name))
    return SpecOPDAlgo


def _make_worker_class():
    from sglang_specopd.server.drafter.swap import current_version
    from sglang_specopd.server.traces import record_verify_step, record_versions, wants_trace
    from sglang_specopd.server.traffic.spool import recording
    from sglang_specopd.server.traffic.features import capture_prefill, capture_verify, capturing
    from sglang_specopd.server.traffic.optout import any_kept
    from sglang_specopd.server.goodput.step import controller_for, settings_from_env
    from sglang_specopd.server.goodput.verify import accept_narrow
    from sglang_specopd.server.goodput.plain import catch_up, clear_pending, plain_decode_step, plain_ok

    DFlashWorkerV2 = compat.get("DFlashWorkerV2")
    _commit_accept = compat.get("_commit_accept")
    is_dense_head_weight = compat.get("is_dense_head_weight")
    resolve_greedy_mask = compat.get("resolve_greedy_mask")

    from sglang_specopd.server.sampled_drafts import draft_sampling_mode, sample_block, verify_block

    sampled = draft_sampling_mode() == "sample"  # read at server start: a bad value fails the launch, not a step
    keep_all = recording()  # live-traffic spool on: every request's verify records are kept (server/traffic/spool.py)
    capture = keep_all and capturing()  # and the target's context features of every served token (traffic.features)
    settings_from_env()  # the speculative policy (server/goodput/step.py): a bad setting fails the launch

    class SpecOPDWorker(DFlashWorkerV2):
        """``DFlashWorkerV2`` that records (anchor, proposed tokens, accepted count, drafter version) per verify step
        and serves sampled draft blocks with lossless verification at temperature > 0."""

        _specopd_reqs = None
        _specopd_sampling = None  # the batch's sampling_info while this step drafts by sampling
        _specopd_q = None  # [bs, gamma, V] fp32: the q the current block was sampled from
        _specopd_step = None  # the decode step in flight: k drafts verified (server/goodput/verify.py StepState)

        def forward_batch_generation(self, batch, *args, **kwargs):
            self._specopd_reqs = getattr(batch, "reqs", None)
            info = getattr(batch, "sampling_info", None)
            if info is not None and not info.is_all_greedy and sampled:
                self._specopd_sampling = info
            policy = controller_for(self)  # how many drafts this step verifies (server/goodput/step.py)
            self._specopd_step = step = policy.begin(self, batch, current_version())
            ok = False
            try:
                if step is None:  # a prefill (re-prefill of a retracted request) writes the drafter's context
                    if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                        clear_pending(batch.reqs)
                    out = super().forward_batch_generation(batch, *args, **kwargs)
                elif step.k == 0 and policy.settings.plain_k0 and plain_ok(
                        batch, capturing_features=capture and any_kept(batch.reqs)):  # no spooled request: plain
                    out = plain_decode_step(self, batch, step, kwargs.get("on_publish", args[0] if args else None),
                                            max_pending=policy.settings.catch_up_every)
                else:  # drafting: the drafter's context first gets the positions plain steps left (goodput.plain)
                    step.caught += catch_up(self, batch.reqs)
                    out = super().forward_batch_generation(batch, *args, **kwargs)
                ok = True
                return out
            finally:
                policy.end(self, step, ok)
                self._specopd_reqs = self._specopd_sampling = self._specopd_q = self._specopd_step = None

        def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states, lm_head, chunk_size: int = 256):
            step = self._specopd_step
            if step is None:
                return self._specopd_draft_head(hidden_states, lm_head, chunk_size)
            # skipped when the step verifies no draft, timed otherwise
            return step.proposals(hidden_states, lambda: self._specopd_draft_head(hidden_states, lm_head, chunk_size))

        def _specopd_draft_head(self, hidden_states, lm_head, chunk_size):
            info = self._specopd_sampling
            weight = getattr(lm_head, "weight", None)
            vocab = int(self.model_runner.model_config.vocab_size)
            gamma = int(self.block_size) - 1
            if (info is None or not is_dense_head_weight(weight) or weight.shape[0] < vocab
                    or hidden_states.shape[0] % gamma):  # sharded / quantized head: DFLASH's greedy drafts
                return super()._greedy_sample_from_vocab_parallel_head(
                    hidden_states=hidden_states, lm_head=lm_head, chunk_size=chunk_size)
            bs = hidden_states.shape[0] // gamma
            logits = hidden_states.to(weight.dtype) @ weight[:vocab].T
            greedy = resolve_greedy_mask(bs=bs, sampling_info=info, device=logits.device)
            tokens, self._specopd_q = sample_block(logits.view(bs, gamma, vocab), info.temperatures, greedy)
            return tokens.view(-1)

        def _append_target_hidden_to_draft_kv_by_loc(self, **kwargs):
            super()._append_target_hidden_to_draft_kv_by_loc(**kwargs)
            reqs = self._specopd_reqs
            if capture and reqs:  # the rows the drafter's context KV was just filled from, kept for the spool
                if kwargs.get("commit_lens") is not None:
                    capture_verify(reqs, kwargs["target_hidden"], kwargs["positions"], kwargs["commit_lens"],
                                   int(self.block_size))
                elif kwargs.get("extend_lens") is not None:
                    capture_prefill(reqs, kwargs["target_hidden"], kwargs["positions"],
                                    kwargs["extend_lens"].tolist())

        def _accept_block(self, **kwargs):
            q, self._specopd_q = self._specopd_q, None
            step = self._specopd_step
            if step is not None and step.narrow:  # k < block_size - 1 drafts verified (server/goodput/verify.py)
                out = accept_narrow(step, q=q, block_verification=self._block_verification, **kwargs)
            elif q is not None and self._selector_sample is None and kwargs.get("target_predict") is None:
                candidates = kwargs["candidates"]
                accept_len, bonus = verify_block(
                    candidates=candidates, target_logits=kwargs["next_token_logits"], draft_probs=q,
                    sampling_info=kwargs["sampling_info"], draft_input=kwargs["draft_input"],
                    block_verification=self._block_verification)
                out_tokens, commit_lens = _commit_accept(candidates, accept_len, bonus)
                out = (accept_len, commit_lens, bonus, out_tokens, None)
            else:
                out = super()._accept_block(**kwargs)
            reqs = self._specopd_reqs
            if step is not None:
                step.accept_len = out[0]
            if reqs and (step is None or step.k > 0):  # a step that verified no draft proposed nothing
                version = current_version()  # swaps run between batches: the version whose weights drafted this block
                record_versions(reqs, version)
                if metrics.enabled():  # Prometheus counters (docs/metrics.md); no device sync when off
                    metrics.record_verify(out[0][: len(reqs)].tolist(), step.k if step is not None and step.narrow
                                          else int(self.block_size) - 1)
                if keep_all or any(wants_trace(r) for r in reqs):
                    candidates = kwargs["candidates"]
                    record_verify_step(reqs, kwargs["prefix_lens"].tolist(), candidates[:, 1:].tolist(),
                                       out[0].tolist(), version, keep_all=keep_all,
                                       verified=step.k if step is not None and step.narrow else None)
            return out

    return SpecOPDWorker


def resolve_specopd_server_args(result, server_args):
    """AFTER hook on ``handle_speculative_decoding``: give SPECOPD the DFLASH resolution (block size, backends)."""
    if (compat.get("resolving_view")(server_args).speculative_algorithm or "").upper() == ALGORITHM_NAME:
        compat.get("_handle_dflash")(server_args)
    return result


def register_algorithm() -> None:
    """Register ``SPECOPD`` with SGLang (idempotent per process)."""
    if compat.get("get_spec")(ALGORITHM_NAME) is not None:
        return

    spec_class = make_spec_class("DFLASH")

    @compat.get("SpeculativeAlgorithm.register")(ALGORITHM_NAME, supports_overlap=True, spec_class=spec_class)
    def _factory(server_args):
        return _make_worker_class()

    compat.hook("handle_speculative_decoding", resolve_specopd_server_args)
