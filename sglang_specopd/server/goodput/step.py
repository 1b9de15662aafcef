"""The SPECOPD worker's speculative policy, step by step (issue 42): :class:`GoodputController`.

One controller per worker (:func:`controller_for`). For every decode step :meth:`GoodputController.begin` asks the
policy (:class:`sglang_specopd.server.goodput.policy.GoodputPolicy`) for k, the number of drafts to verify, and puts the
step's views in place of the worker's target worker and draft model runner
(:mod:`sglang_specopd.server.goodput.verify`); :meth:`GoodputController.end` puts the runners back, feeds the
measured step time and the accept lengths to the policy, and counts the step. The policy's settings come from
:data:`~sglang_specopd.wire.policy.POLICY_ENV` (the server config's ``speculative_policy``) and can be replaced on a
running server (``POST /specopd/policy``, :func:`set_policy`).

Whole blocks are verified whatever the policy when the worker cannot narrow its verify (``unsupported``: DFlash V2
selector / LiLiCorr / Domino drafters, a windowed draft cache, hybrid (mamba) targets, DP attention, tensor
parallelism) or a batch cannot (grammar, log-probs, sampling masks: reason ``batch``).
"""

from __future__ import annotations

import os
import time
from typing import Optional

from sglang_specopd.server import metrics
from sglang_specopd.server.goodput.policy import GoodputPolicy, request_class
from sglang_specopd.server.goodput.verify import DraftView, StepState, TargetView, _sync
from sglang_specopd.server.traces import record_verify_k
from sglang_specopd.wire.policy import POLICY_ENV, PolicySettings, PolicyStats, StepBreakdown

_EST_ATTR = "_specopd_goodput_est"  # on a Req: (drafter version, SlotEstimate, request class)
MAX_GAP_S = 1.0  # scheduler time between two decode steps counted into a step (longer: the server was idle)


def settings_from_env(environ=None) -> PolicySettings:
    """:data:`POLICY_ENV` as :class:`PolicySettings` (unset: the fixed policy). Raises ValueError on bad JSON."""
    raw = (os.environ if environ is None else environ).get(POLICY_ENV, "").strip()
    if not raw:
        return PolicySettings()
    try:
        return PolicySettings.model_validate_json(raw)
    except Exception as exc:
        raise ValueError(f"{POLICY_ENV}: {exc}") from None


def unsupported_reason(worker) -> Optional[str]:
    """Why ``worker`` (a DFlashWorkerV2) verifies whole blocks whatever the policy, or None."""
    args = worker.server_args
    checks = (
        (getattr(worker, "selector", None) is not None, "DFlash V2 candidate-selector drafter"),
        (getattr(worker, "lilicorr", None) is not None, "LiLiCorr drafter head"),
        (bool(getattr(worker, "_is_domino", False)), "Domino drafter"),
        (bool(getattr(worker, "use_compact_draft_cache", False)), "windowed (compact) draft cache"),
        (bool(getattr(worker, "_need_mamba_verify_commit", False)), "hybrid (mamba) target"),
        (bool(getattr(args, "enable_dp_attention", False)), "DP attention"),
        (int(getattr(args, "tp_size", 1) or 1) > 1, "tensor parallelism"),
    )
    found = [why for bad, why in checks if bad]
    return ", ".join(found) or None


class GoodputController:
    """The policy state of one worker and the step in flight (see the module docstring)."""

    def __init__(self, worker, settings: PolicySettings):
        self.block = int(worker.block_size)
        self.draft_hidden = int(worker.draft_model.config.hidden_size)
        self.unsupported = unsupported_reason(worker)
        self.reset(settings)

    def reset(self, settings: PolicySettings) -> None:
        """New settings; every estimate and counter starts again."""
        self.settings = settings
        self.policy = GoodputPolicy(self.block - 1, settings)
        self.version = None
        self.k_hist = [0] * self.block
        self.reasons = {}
        self.sums = {"step": 0.0, "target": 0.0, "draft": 0.0, "rows": 0.0, "steps": 0, "plain": 0, "caught": 0}
        self._last_end = None  # perf_counter at the end of the previous decode step (None after a prefill)

    @property
    def active(self) -> bool:
        """True when the goodput policy chooses k (not fixed, and the worker can narrow)."""
        return self.settings.policy == "goodput" and self.unsupported is None

    def _estimates(self, reqs, version):
        if version != self.version:  # a hot swap: the new drafter's acceptance is unknown
            if self.version is not None:
                self.policy.reset_acceptance()
            self.version = version
        ests, classes = [], []
        for r in reqs:
            held = getattr(r, _EST_ATTR, None)
            if held is None or held[0] != version:
                params = getattr(r, "sampling_params", None)
                cls = request_class(float(getattr(params, "temperature", 1.0)), int(getattr(params, "top_k", -1)))
                held = (version, self.policy.new_request_estimate(), cls)
                setattr(r, _EST_ATTR, held)
            ests.append(held[1])
            classes.append(held[2])
        return ests, classes

    def begin(self, worker, batch, version) -> Optional[StepState]:
        """Before a step: for a decode batch choose k and install the step's views; None for other batches."""
        mode = batch.forward_mode
        if mode.is_extend() or batch.is_extend_in_batch or mode.is_idle() or not batch.reqs:
            self._last_end = None
            return None
        t0 = time.perf_counter()
        gamma = self.block - 1
        if not self.active:
            k, reason = gamma, "fixed" if self.settings.policy == "fixed" else "unsupported"
            ests = classes = None
        elif batch.has_grammar or batch.return_logprob or getattr(
                batch.sampling_info, "sampling_mask_batch_indices", None) is not None:
            k, reason, ests, classes = gamma, "batch", None, None
        else:
            ests, classes = self._estimates(batch.reqs, version)
            k, reason = self.policy.plan(ests, classes)
        step = StepState(k=k, block=self.block, reason=reason, batch=batch, device=worker.device,
                         draft_hidden=self.draft_hidden)
        step.t0, step.ests, step.classes = t0, ests, classes
        step.gap = t0 - self._last_end if self._last_end is not None and t0 - self._last_end < MAX_GAP_S else 0.0
        step.real = (worker._target_worker, worker.draft_model_runner)
        worker._target_worker = TargetView(step.real[0], step)
        worker.draft_model_runner = DraftView(step.real[1], step)
        return step

    def end(self, worker, step: Optional[StepState], ok: bool) -> None:
        """After the step (``ok``: it returned normally): runners back; measurements and observations."""
        if step is None:
            return
        worker._target_worker, worker.draft_model_runner = step.real
        if not ok:
            self._last_end = None
            return
        _sync(step.device)
        now = time.perf_counter()
        seconds = now - step.t0 + step.gap
        self._last_end = now
        bs = len(step.batch.reqs)
        if step.ests is not None:
            self.policy.costs.observe(bs, step.k, seconds)
            if step.k > 0 and step.accept_len is not None:
                self.policy.observe(step.ests, step.k, step.accept_len.tolist(), step.classes)
        if self.settings.policy == "goodput":
            record_verify_k(step.batch.reqs, step.k)
            metrics.record_policy_k(step.k)
        self.k_hist[step.k] += 1
        self.reasons[step.reason] = self.reasons.get(step.reason, 0) + 1
        s = self.sums
        s["steps"] += 1
        s["plain"] += int(step.plain)
        s["caught"] += step.caught
        s["step"] += seconds
        s["target"] += step.target_s
        s["draft"] += step.draft_s
        s["rows"] += step.width

    def stats(self) -> PolicyStats:
        """What the policy did since it started or was last set."""
        s, n = self.sums, self.sums["steps"]
        ms = (lambda x: x * 1000.0 / n) if n else (lambda x: None)
        breakdown = StepBreakdown(steps=n, verify_rows=s["rows"] / n if n else None, step=ms(s["step"]),
                                  target_forward=ms(s["target"]),
                                  drafter_forward=ms(s["draft"]),
                                  other=ms(s["step"] - s["target"] - s["draft"]))
        return PolicyStats(settings=self.settings, gamma=self.block - 1, steps=n,
                           k_histogram={k: c for k, c in enumerate(self.k_hist)}, reasons=dict(self.reasons),
                           cost_curve_ms=self.policy.costs.table_ms(), cost_curve_fit_ms=self.policy.costs.fit_ms(),
                           slot_acceptance=self.policy.prior(), class_acceptance=self.policy.class_acceptance(),
                           breakdown=breakdown, unsupported=self.unsupported, plain_steps=s["plain"],
                           context_catch_up=s["caught"])


def controller_for(worker) -> GoodputController:
    """The worker's controller, created on first use from :func:`settings_from_env`."""
    ctl = getattr(worker, "_specopd_goodput", None)
    if ctl is None:
        ctl = GoodputController(worker, settings_from_env())
        worker._specopd_goodput = ctl
    return ctl
