"""Pure-torch ``chain_speculative_sampling_triton`` for SGLang's CPU engine (CPU adaptation 8).

SGLang's ``accept_sampling`` (sglang/kernels/ops/speculative/dspark/dspark_accept.py), which the SPECOPD worker
uses to verify SAMPLED draft blocks (:mod:`sglang_specopd.server.sampled_drafts`), calls the Triton kernel
``chain_speculative_sampling_triton`` (sglang/kernels/ops/speculative/reject_sampling.py), which needs a GPU
driver. This is the same algorithm in torch ("classic" chain verification, Leviathan et al. 2023, Algorithm 1;
Chen et al. 2023): for slot k = 1.. accept the draft token x_k while ``coin_k * q_{k}(x_k) < p_{k}(x_k)`` (and
q_k(x_k) is a probability in (0, 1]); the final token is drawn by inverse CDF with ``coin_final`` from
``norm(max(p - q, 0))`` at the first rejected slot, or from p after the last slot when every draft was accepted.

Shapes (the Triton op's contract): candidates [bs, N] int64 (slot 0 = the verified root, slots 1..N-1 = drafts);
retrive_index [bs, N] int64; uniform_samples [bs, >= N-1] f32; uniform_samples_for_final_sampling [bs] f32;
target_probs [bs, N, V] f32 (row j = target distribution after candidate j); draft_probs [bs, N-1, V] f32
(row j = the distribution candidate j+1 was sampled from). Outputs written in place: predicts [bs*N] int32,
accept_index [bs, N] int32, accept_token_num [bs] int32. ``block_verification`` (arXiv 2403.10444) is not
implemented here and raises ``NotImplementedError``.
"""

from __future__ import annotations

import torch

from sglang_specopd.server.cpu.sampling_verify import inverse_cdf_sample


def chain_speculative_sampling(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
    threshold_single=1.0, threshold_acc=1.0, deterministic=True, *, block_verification: bool = False,
):
    """In-place op with the Triton kernel's contract (see module docstring)."""
    if block_verification:
        raise NotImplementedError("block verification is not implemented by the CPU chain-sampling op; "
                                  "serve without --speculative-use-block-verification")
    bs, num_slots = candidates.shape
    cand = candidates.tolist()
    r_index = retrive_index.tolist()
    coins = uniform_samples.tolist()
    finals = uniform_samples_for_final_sampling.tolist()
    for b in range(bs):
        last = r_index[b][0]
        accept_index[b, 0] = last
        n_acc = 0
        for step in range(1, num_slots):
            tok = cand[b][step]
            p = float(target_probs[b, step - 1, tok])
            q = float(draft_probs[b, step - 1, tok])
            if not (0.0 < q <= 1.0 and coins[b][step - 1] * q < p):
                break
            predicts[last] = tok
            n_acc += 1
            last = r_index[b][step]
            accept_index[b, n_acc] = last
        accept_token_num[b] = n_acc
        p_row = target_probs[b, n_acc].float()
        if n_acc == num_slots - 1:
            residual = p_row
        else:
            q_row = draft_probs[b, n_acc].float()
            q_row = torch.where((q_row >= 0) & (q_row <= 1), q_row, torch.zeros_like(q_row))
            residual = torch.clamp(p_row - q_row, min=0.0)
        predicts[last] = inverse_cdf_sample(torch.cumsum(residual, dim=0), finals[b])


def install() -> None:
    """Point SGLang's ``accept_sampling`` at the torch op (CPU engine only)."""
    from sglang_specopd.server import compat

    compat.patch("chain_speculative_sampling_triton", chain_speculative_sampling)
