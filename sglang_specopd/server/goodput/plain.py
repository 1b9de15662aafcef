"""A k = 0 step as SGLang's plain decode, and the drafter's context caught up when drafting resumes (issue 53).

When the goodput policy verifies no draft, :func:`plain_decode_step` replaces the whole DFlash step for the batch:
the target runs one DECODE forward (SGLang's ``TpModelWorker.forward_batch_generation`` on the batch as a plain
decode batch: input the previous step's bonus token, ``seq_lens`` + 1, the KV slot the scheduler already reserved
at the committed length), samples with SGLang's own sampler, and the result goes back to the scheduler in the
DFlash step's format (one committed token per request). No block is built, nothing is verified, and the drafter's
context K/V is not written: the target's hidden states of the layers the drafter reads (the DFlash aux capture, the
same ``CaptureHiddenMode.FULL`` the prefill uses) are kept on the request with the position and the drafter-pool
slot (:data:`PENDING_ATTR`), and :func:`catch_up` writes all of a batch's pending positions in one batched pass
(SGLang's ``_append_target_hidden_to_draft_kv_by_loc``, as for a prefill) before the next step that drafts, or
when a request holds ``catch_up_every`` positions (PolicySettings; a request that never drafts again keeps bounded
memory).

Pending positions are dropped when a request is prefilled again (a retracted request's re-prefill writes its whole
context) and die with a finished request: a later request that reuses such a request's cached prefix finds no
drafter context at those positions (its drafts may be worse there; its output is unchanged: verification is
lossless). Used only where the policy can narrow (goodput.step's ``unsupported``) and the batch allows it
(:func:`plain_ok`: no live-traffic feature capture, no penalties, host sequence lengths known; on a GPU the decode
forward runs eagerly: the target's graphs are captured for TARGET_VERIFY).
"""

from __future__ import annotations

import time
from typing import List, Optional

import torch

from sglang_specopd.server import compat

PENDING_ATTR = "_specopd_ctx_pending"  # on a Req: [(target hidden [1, D], drafter slot [1], position [1]), ...]
_BATCH_FIELDS = ("forward_mode", "input_ids", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "out_cache_loc",
                 "spec_info", "spec_algorithm", "can_run_decode_cuda_graph")


def plain_ok(batch, *, capturing_features: bool) -> bool:
    """True when this decode batch can run its k = 0 step as a plain decode."""
    info = batch.sampling_info
    orchestrator = getattr(info, "penalizer_orchestrator", None)
    return (not capturing_features and batch.seq_lens_cpu is not None and batch.spec_info is not None
            and getattr(batch.spec_info, "bonus_tokens", None) is not None
            and not (orchestrator is not None and orchestrator.is_required))


def clear_pending(reqs) -> None:
    """Forget the requests' pending drafter context (they are being prefilled: the prefill writes it)."""
    for r in reqs or ():
        if getattr(r, PENDING_ATTR, None):
            setattr(r, PENDING_ATTR, None)


def catch_up(worker, reqs) -> int:
    """Write the drafter's context K/V of every pending position of ``reqs`` in one batched pass; returns the
    number of positions written."""
    rows: List[tuple] = []
    for r in reqs or ():
        held = getattr(r, PENDING_ATTR, None)
        if held:
            rows.extend(held)
            setattr(r, PENDING_ATTR, None)
    if not rows:
        return 0
    hidden = torch.cat([h for h, _, _ in rows])
    loc = torch.cat([c for _, c, _ in rows])
    pos = torch.cat([p for _, _, p in rows])
    worker._append_target_hidden_to_draft_kv_by_loc(target_hidden=hidden, cache_loc=loc, positions=pos)
    return len(rows)


def plain_decode_step(worker, batch, step, on_publish=None, max_pending: int = 64):
    """Run the decode batch's step as SGLang's plain decode (see the module docstring); returns the
    GenerationBatchResult the DFlash step would (one committed token per request). ``step``: the policy's
    StepState (its target time is added); when a request then holds ``max_pending`` positions the batch is caught
    up in this step."""
    ForwardMode, SpeculativeAlgorithm = compat.get("ForwardMode"), compat.get("SpeculativeAlgorithm")
    CaptureHiddenMode, GenerationBatchResult = compat.get("CaptureHiddenMode"), compat.get("GenerationBatchResult")
    draft_input = batch.spec_info
    bs, block = len(batch.seq_lens), int(worker.block_size)
    prefix = batch.seq_lens  # committed lengths: the bonus token goes to position prefix
    req_to_token = worker.model_runner.req_to_token_pool.req_to_token
    slot = req_to_token[batch.req_pool_indices.long(), prefix.long()].to(torch.int64)  # reserved by the scheduler
    saved = {n: getattr(batch, n) for n in _BATCH_FIELDS}
    t0 = time.perf_counter()
    try:
        batch.forward_mode = ForwardMode.DECODE
        batch.input_ids = draft_input.bonus_tokens.to(torch.int64)
        batch.seq_lens = prefix + 1
        batch.seq_lens_cpu = saved["seq_lens_cpu"] + 1
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        batch.out_cache_loc = slot
        batch.spec_info, batch.spec_algorithm = None, SpeculativeAlgorithm.NONE
        batch.can_run_decode_cuda_graph = False
        out = worker.target_worker.forward_batch_generation(
            batch, capture_hidden_mode=CaptureHiddenMode.FULL, return_kv_loc_plan=True)
    finally:
        for n, v in saved.items():
            setattr(batch, n, v)
    plan, out.kv_loc_plan = out.kv_loc_plan, None
    logits_output, next_ids = out.logits_output, out.next_token_ids.to(torch.int64)
    hidden = logits_output.hidden_states
    if hidden is None:
        raise RuntimeError("plain decode step: the target returned no hidden states for the drafter's context")
    _keep_pending(batch.reqs, hidden[:bs], worker._draft_write_ids(plan), prefix)
    if any(len(getattr(r, PENDING_ATTR)) >= max_pending for r in batch.reqs):
        step.caught += catch_up(worker, batch.reqs)
    logits_output.hidden_states = None
    new_seq_lens = prefix + 1
    if on_publish is not None:
        on_publish(new_seq_lens)
    out_tokens = torch.zeros((bs, block), dtype=torch.int64, device=next_ids.device)
    out_tokens[:, 0] = next_ids
    step.target_s += time.perf_counter() - t0
    step.plain = True
    return GenerationBatchResult(
        logits_output=logits_output, next_token_ids=out_tokens.reshape(-1),
        accept_lens=torch.ones(bs, dtype=torch.int32, device=next_ids.device), can_run_cuda_graph=False,
        next_draft_input=worker._make_next_draft_input_decode(bonus_tokens=next_ids, new_seq_lens=new_seq_lens),
        speculative_num_draft_tokens=block, new_seq_lens=new_seq_lens)


def _keep_pending(reqs, hidden: torch.Tensor, loc: torch.Tensor, positions: torch.Tensor) -> None:
    hidden, loc, positions = hidden.detach().clone(), loc.to(torch.int64), positions.to(torch.int64)
    for i, r in enumerate(reqs):
        held: Optional[list] = getattr(r, PENDING_ATTR, None)
        if held is None:
            held = []
            setattr(r, PENDING_ATTR, held)
        held.append((hidden[i: i + 1], loc[i: i + 1], positions[i: i + 1]))
