"""Verifying k of a block's drafts inside SGLang's DFlash step (issue 42): the narrowed verify forward, the skipped
drafter and the truncated acceptance.

SGLang's ``DFlashWorkerV2.forward_batch_generation`` drafts a block of B = block_size tokens per request and builds
one TARGET_VERIFY forward of B rows per request. For a step that verifies k < B - 1 drafts, the SPECOPD worker puts
two stand-ins in place of its runners for the length of the step (:mod:`sglang_specopd.server.goodput.step`):

* :class:`TargetView` (the worker's target worker): its verify forward is rebuilt on the first W = k + 1 rows of
  each request (``DFlashVerifyInput`` with ``draft_token_num = W``, the iteration's KV plan cut to columns
  ``[0, W)``, host lengths + W), so the target runs bs * W rows; its logits and hidden states are padded back to B
  rows per request (zeros past W) so the rest of SGLang's step keeps its shapes. Rows past W are never read:
  acceptance stops at k (:func:`accept_narrow`) and the drafter's context K/V is written for the committed
  (<= W) rows only. On GPUs the captured TARGET_VERIFY graph has width B, so SGLang runs a narrowed verify eagerly
  (its replay requires the captured width).
* :class:`DraftView` (the worker's draft model runner): for k = 0 the drafter's forward is skipped (nothing is
  verified; the step is a plain decode step of one row per request, whose target hidden states still fill the
  drafter's context K/V at the committed position, so the drafter's context stays complete).

Both views time the forwards they run (the step-time breakdown). They delegate every other attribute.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Optional

import torch

from sglang_specopd.server import compat


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class StepState:
    """One decode step of the SPECOPD worker: ``k`` drafts verified of ``block - 1`` (``width = k + 1`` rows per
    request), the seconds spent in the target and drafter forwards, the accept lengths when known."""

    def __init__(self, *, k: int, block: int, reason: str, batch, device, draft_hidden: int):
        self.k, self.block, self.reason, self.batch, self.device = k, block, reason, batch, device
        self.width = k + 1
        self.draft_hidden = draft_hidden
        self.target_s = 0.0
        self.draft_s = 0.0
        self.accept_len: Optional[torch.Tensor] = None
        self.plain = False  # run as SGLang's plain decode (server/goodput/plain.py)
        self.caught = 0  # drafter-context positions written by catch-up passes in this step (goodput/plain.py)

    def proposals(self, hidden_states: torch.Tensor, draft_head):
        """The drafter head's ``draft_head()`` token ids [bs * gamma] (timed), or zeros when this step verifies no
        draft (``hidden_states``: [bs * gamma, H], the head's input, for the shape and device)."""
        if self.k == 0:
            return torch.zeros(hidden_states.shape[0], dtype=torch.int64, device=hidden_states.device)
        t0 = time.perf_counter()
        out = draft_head()
        _sync(self.device)
        self.draft_s += time.perf_counter() - t0
        return out

    @property
    def narrow(self) -> bool:
        """True when fewer rows than the block are verified."""
        return self.width < self.block


def _pad_rows(t: Optional[torch.Tensor], bs: int, width: int, block: int) -> Optional[torch.Tensor]:
    """[bs * width, ...] -> [bs * block, ...], request-major, zeros past ``width`` in each request's rows."""
    if t is None:
        return None
    tail = tuple(t.shape[1:])
    out = t.new_empty((bs, block) + tail)
    out[:, :width].copy_(t.view((bs, width) + tail))
    out[:, width:].zero_()
    return out.view((bs * block,) + tail)


def narrow_verify_batch(batch, forward_batch, width: int, block: int, target_worker):
    """A TARGET_VERIFY ForwardBatch over the first ``width`` rows of each request of ``forward_batch`` (built by
    SGLang for ``block`` rows), prepared (attention metadata included) by SGLang's own ``prepare_for_verify`` on
    ``batch``, whose fields it touches are restored before returning."""
    DFlashVerifyInput, CaptureHiddenMode = compat.get("DFlashVerifyInput"), compat.get("CaptureHiddenMode")
    full = forward_batch.spec_info
    bs = int(forward_batch.batch_size)
    plan = full.kv_loc_plan
    verify = DFlashVerifyInput(
        draft_token=full.draft_token.view(bs, block)[:, :width].reshape(-1),
        positions=full.positions.view(bs, block)[:, :width].reshape(-1),
        draft_token_num=width, custom_mask=None, capture_hidden_mode=CaptureHiddenMode.FULL,
        kv_loc_plan=plan, kv_loc_cols=slice(0, width) if plan is not None else None)
    names = ("input_ids", "spec_info", "out_cache_loc", "seq_lens_cpu", "seq_lens_sum")
    saved = {n: getattr(batch, n) for n in names}
    try:
        if saved["out_cache_loc"] is not None:
            batch.out_cache_loc = saved["out_cache_loc"].view(bs, block)[:, :width].reshape(-1)
        committed = saved["seq_lens_cpu"]
        host = committed + width if committed is not None else forward_batch.seq_lens_cpu
        if host is not None:
            batch.seq_lens_cpu = host
            batch.seq_lens_sum = int(host.sum())
        narrowed, _ = verify.prepare_for_verify(batch, target_worker)
    finally:
        for n, v in saved.items():
            setattr(batch, n, v)
    return narrowed


class TargetView:
    """The target worker during one step (see the module docstring)."""

    def __init__(self, real, step: StepState):
        self._real, self._step = real, step

    def __getattr__(self, name):
        return getattr(self._real, name)

    def forward_batch_generation(self, batch=None, forward_batch=None, *args, **kwargs):
        step = self._step
        if not kwargs.get("is_verify") or forward_batch is None:
            return self._real.forward_batch_generation(batch, forward_batch, *args, **kwargs)
        t0 = time.perf_counter()
        if step.narrow:
            forward_batch = narrow_verify_batch(step.batch, forward_batch, step.width, step.block, self._real)
            kwargs["skip_attn_backend_init"] = True
        out = self._real.forward_batch_generation(batch, forward_batch, *args, **kwargs)
        if step.narrow:
            logits = out.logits_output
            bs = int(forward_batch.batch_size)
            logits.next_token_logits = _pad_rows(logits.next_token_logits, bs, step.width, step.block)
            logits.hidden_states = _pad_rows(logits.hidden_states, bs, step.width, step.block)
        _sync(step.device)
        step.target_s += time.perf_counter() - t0
        return out


class DraftView:
    """The draft model runner during one step: skipped when k = 0, timed otherwise."""

    def __init__(self, real, step: StepState):
        self._real, self._step = real, step

    def __getattr__(self, name):
        return getattr(self._real, name)

    def forward(self, forward_batch, *args, **kwargs):
        step = self._step
        if step.k == 0:  # nothing will be verified: no proposals needed (the output's shape only)
            rows = int(forward_batch.input_ids.shape[0])
            hidden = torch.empty((rows, step.draft_hidden), device=forward_batch.input_ids.device)
            return SimpleNamespace(logits_output=SimpleNamespace(hidden_states=hidden), can_run_graph=False)
        t0 = time.perf_counter()
        out = self._real.forward(forward_batch, *args, **kwargs)
        _sync(step.device)
        step.draft_s += time.perf_counter() - t0
        return out


def accept_narrow(step: StepState, *, candidates, next_token_logits, sampling_info, draft_input,
                  target_predict=None, q=None, block_verification: bool = False, **_):
    """Acceptance over the first ``step.k`` drafts, as SGLang's / SPECOPD's verify rules over a block of
    ``step.width`` (the same rule the full step would use: sampled drafts with their q, SGLang's target-only
    sampling, or greedy), so a step of k drafts is a lossless speculative step of draft length k (when all k are
    accepted the bonus is drawn from the target's distribution after draft k).

    Args:
        candidates: [bs, B] int64, slot 0 the bonus token of the previous step; next_token_logits: [bs * B, V]
            (rows past ``width`` padding); target_predict: [bs * B] argmax ids or None; q: [bs, B-1, V] fp32 (the
            sampled drafts' distribution) or None.
    Returns:
        (accept_len [bs] int32 in 0..k, commit_lens [bs] int32, bonus [bs] int64, out_tokens [bs, B] int64, None):
        the tuple ``DFlashWorkerV2._accept_block`` returns.
    """
    bs, block, width = candidates.shape[0], step.block, step.width
    cand = candidates[:, :width].contiguous()
    logits = None
    if next_token_logits is not None:
        logits = next_token_logits.view(bs, block, -1)[:, :width].reshape(bs * width, -1)
    greedy = sampling_info is None or sampling_info.is_all_greedy
    if q is not None and target_predict is None:
        from sglang_specopd.server.sampled_drafts import verify_block

        accept_len, bonus = verify_block(candidates=cand, target_logits=logits, draft_probs=q[:, : width - 1],
                                         sampling_info=sampling_info, draft_input=draft_input,
                                         block_verification=block_verification)
    elif target_predict is None and not greedy and compat.get("is_dflash_sampling_verify_available")():
        accept_len, bonus = compat.get("compute_dflash_sampling_correct_drafts_and_bonus")(
            candidates=cand, next_token_logits=logits, sampling_info=sampling_info,
            max_top_k=draft_input.max_top_k, uniform_top_k_value=draft_input.uniform_top_k_value)
    else:
        if target_predict is None:
            predict = torch.argmax(logits, dim=-1).view(bs, width)
        else:
            predict = target_predict.view(bs, block)[:, :width].contiguous()
        accept_len, bonus = compat.get("compute_dflash_correct_drafts_and_bonus")(
            candidates=cand, target_predict=predict)
    accept_len, bonus = accept_len.to(torch.int32), bonus.to(torch.int64)
    out_tokens, commit_lens = compat.get("_commit_accept")(candidates, accept_len, bonus)
    return accept_len, commit_lens, bonus, out_tokens, None
