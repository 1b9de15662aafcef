"""Sampled draft blocks with lossless speculative-sampling verification: the DFlash reference's T > 0 semantics.

SGLang 0.5.23's DFLASH worker drafts every block greedily (argmax per slot) and, at temperature > 0, verifies
"target only": draft x_k is accepted with probability p_k(x_k). The DFlash reference (z-lab/dflash) and the
speculative-sampling papers (Leviathan et al. 2023; Chen et al. 2023) instead SAMPLE each slot from the drafter
q_k = softmax(z_k / T) and accept x_k with probability min(1, p_k(x_k) / q_k(x_k)), drawing the correction token
from norm(max(p - q, 0)). Both are lossless; with sampled drafts the expected acceptance per slot is
alpha_k = sum_v min(p_k(v), q_k(v)) = 1 - TV(p_k, q_k), which is exactly what SpecOPD's E2E-TV loss
(:mod:`kernels.losses`) maximises. SPECOPD serves sampled drafts by default; ``SPECOPD_DRAFT_SAMPLING=greedy``
restores DFLASH's greedy drafts. Rows whose request is greedy (``top_k <= 1``, i.e. temperature 0) always take
the argmax with a one-hot q, so temperature-0 outputs are unchanged.

Verification is SGLang's own ``accept_sampling`` (the DSpark selector's chain verifier, Triton on CUDA; on the CPU
engine its kernel is replaced by :mod:`sglang_specopd.server.cpu.chain_sampling`).
"""

from __future__ import annotations

import os

import torch

MODE_ENV = "SPECOPD_DRAFT_SAMPLING"
MODES = ("sample", "greedy")


def draft_sampling_mode() -> str:
    """``$SPECOPD_DRAFT_SAMPLING`` (default ``sample``). Raises ValueError for anything but ``sample`` / ``greedy``."""
    mode = os.environ.get(MODE_ENV, "sample").strip().lower() or "sample"
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def sample_block(logits: torch.Tensor, temperatures: torch.Tensor, greedy: torch.Tensor,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one draft block per request, every slot independently (DFlash slots are conditionally independent).

    Args:
        logits: [bs, gamma, V] drafter logits (any float dtype; softmax runs in fp32).
        temperatures: [bs] or [bs, 1] sampling temperature per request (> 0 on sampled rows).
        greedy: [bs] bool, True where the request is greedy: argmax token and a one-hot q.
        generator: optional torch.Generator for reproducible sampling.
    Returns:
        (tokens [bs, gamma] int64, q [bs, gamma, V] fp32), q the distribution each token was drawn from.
    Raises:
        ValueError: on shape mismatch or a non-positive temperature on a sampled row.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be [bs, gamma, V], got {tuple(logits.shape)}")
    bs, gamma, vocab = logits.shape
    temps = temperatures.reshape(-1).to(torch.float32)
    greedy = greedy.reshape(-1).to(torch.bool)
    if temps.shape[0] != bs or greedy.shape[0] != bs:
        raise ValueError(f"temperatures / greedy must have {bs} rows, got {temps.shape[0]} / {greedy.shape[0]}")
    if bool(((temps <= 0) & ~greedy).any()):
        raise ValueError("a sampled row has temperature <= 0")
    safe = torch.where(greedy, torch.ones_like(temps), temps)
    q = torch.softmax(logits.float() / safe[:, None, None], dim=-1)
    tokens = torch.multinomial(q.view(-1, vocab), 1, generator=generator).view(bs, gamma)
    if bool(greedy.any()):
        top = logits.argmax(dim=-1)
        tokens = torch.where(greedy[:, None], top, tokens)
        onehot = torch.zeros_like(q).scatter_(-1, top.unsqueeze(-1), 1.0)
        q = torch.where(greedy[:, None, None], onehot, q)
    return tokens, q


def verify_block(*, candidates: torch.Tensor, target_logits: torch.Tensor, draft_probs: torch.Tensor,
                 sampling_info, draft_input, block_verification: bool = False):
    """Lossless chain verification of sampled blocks with SGLang's ``accept_sampling``.

    Args:
        candidates: [bs, B] int64, slot 0 the verified root (bonus token), slots 1..B-1 the sampled drafts.
        target_logits: [bs * B, V_t] target logits of the verify forward (row j: after candidate j).
        draft_probs: [bs, B-1, V] fp32 q of each drafted slot; padded / cut to V_t columns here.
        sampling_info, draft_input: SGLang's batch sampling info and DFlash draft input (top-k / top-p of the
            target side are applied by SGLang as in its own verify).
    Returns:
        (accept_len [bs] int32, bonus [bs] int64): accepted drafts per request and the correction/bonus token.
    """
    from sglang_specopd.server import compat

    accept_sampling = compat.get("accept_sampling")
    bs, block = candidates.shape
    vt = int(target_logits.shape[-1])
    if draft_probs.shape[-1] < vt:
        draft_probs = torch.nn.functional.pad(draft_probs, (0, vt - draft_probs.shape[-1]))
    elif draft_probs.shape[-1] > vt:
        draft_probs = draft_probs[..., :vt]
    accept_len, bonus, _ = accept_sampling(
        candidates=candidates, target_logits=target_logits, draft_probs=draft_probs.contiguous(),
        sampling_info=sampling_info, draft_input=draft_input, gamma=block - 1, verify_num_draft_tokens=block,
        cutoff_verify_lens=None, block_verification=block_verification,
    )
    return accept_len.to(torch.int32), bonus.to(torch.int64)
