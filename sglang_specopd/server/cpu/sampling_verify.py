"""Pure-torch ``tree_speculative_sampling_target_only`` for SGLang's CPU engine (CPU adaptation 7).

SGLang 0.5.23 resolves this op only on CUDA/MUSA/NPU; elsewhere it is None and DFLASH silently falls back to
greedy argmax verification for temperature > 0, which does NOT preserve the sampling distribution. This is the
same algorithm as sgl-kernel's ``TreeSpeculativeSamplingTargetOnly`` (speculative_sampling.cuh), written as a
loop over the batch: walk the draft tree from the root; at each level try the children in sibling order and
accept child x with ``coin <= prob_acc / threshold_acc`` or ``p(x) >= threshold_single`` (prob_acc accumulates
the target mass of the tried children; with the default thresholds 1.0 this is "accept x with probability
p(x)"); a rejected child's target mass is moved into ``draft_probs`` so the final token is drawn from
``relu(p - draft_probs)`` normalised (rejected tokens removed), by inverse CDF with ``coin_final``. For DFLASH's
point-mass (one-hot) chain drafts this is lossless speculative sampling.

Shapes (as the CUDA op): candidates [bs, N] int64; retrive_* [bs, N] int64; uniform_samples [bs, N] f32;
uniform_samples_for_final_sampling [bs] f32; target_probs / draft_probs [bs, N, V] f32; outputs written in
place: predicts [bs*N] int32, accept_index [bs, N] int32, accept_token_num [bs] int32.
"""

from __future__ import annotations

import torch


def tree_speculative_sampling_target_only(
    *, predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
    threshold_single=1.0, threshold_acc=1.0, deterministic=True,
):
    """In-place op with the CUDA kernel's contract (see module docstring)."""
    bs, num_draft = candidates.shape
    thr_acc = max(float(threshold_acc), 1e-9)
    thr_single = float(threshold_single)
    cand = candidates.tolist()
    r_index = retrive_index.tolist()
    r_next = retrive_next_token.tolist()
    r_sib = retrive_next_sibling.tolist()
    coins = uniform_samples.tolist()
    finals = uniform_samples_for_final_sampling.tolist()
    for b in range(bs):
        prob_off = 0
        coin = coins[b][0]
        last = r_index[b][0]
        accept_index[b, 0] = last
        n_acc = 0
        cur = 0
        for _ in range(1, num_draft):
            cur = r_next[b][cur]
            prob_acc = 0.0
            while cur != -1:
                tok = cand[b][cur]
                p_single = float(target_probs[b, prob_off, tok])
                prob_acc += p_single
                if coin <= prob_acc / thr_acc or p_single >= thr_single:
                    prob_off = cur
                    coin = coins[b][cur]
                    predicts[last] = tok
                    n_acc += 1
                    accept_index[b, n_acc] = r_index[b][cur]
                    last = r_index[b][cur]
                    break
                draft_probs[b, prob_off, tok] = target_probs[b, prob_off, tok]
                cur = r_sib[b][cur]
            if cur == -1:
                break
        accept_token_num[b] = n_acc
        q = torch.clamp(target_probs[b, prob_off].float() - draft_probs[b, prob_off].float(), min=0.0)
        cdf = torch.cumsum(q, dim=0)
        if float(cdf[-1]) <= 0.0:  # every token rejected (impossible when p sums to 1): fall back to the target
            cdf = torch.cumsum(target_probs[b, prob_off].float(), dim=0)
        predicts[last] = inverse_cdf_sample(cdf, finals[b])


def inverse_cdf_sample(cdf: torch.Tensor, coin: float) -> int:
    """The token whose cumulative mass ``cdf`` ([V], unnormalised, non-decreasing) first exceeds ``coin * cdf[-1]``
    (coin uniform in [0, 1)), clamped to V - 1 as the CUDA/Triton kernels do for a degenerate all-zero cdf."""
    u = coin * float(cdf[-1])
    idx = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype), right=True)[0])
    return min(idx, cdf.shape[0] - 1)


def install() -> None:
    """Point SGLang's DFLASH sampling verify at the torch op (CPU engine only)."""
    from sglang_specopd.server import compat

    compat.patch("verify_sampling.tree_speculative_sampling_target_only", tree_speculative_sampling_target_only)
    compat.patch("dflash_utils.tree_speculative_sampling_target_only", tree_speculative_sampling_target_only)
    compat.patch("dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE", True)
