"""The frozen target LM head applied to the target's final hidden states the server returns (rows of p)."""

from __future__ import annotations

from typing import Dict

import torch

_HEAD_CACHE: Dict[tuple, torch.Tensor] = {}


def target_head_logits(head, hidden: torch.Tensor, dtype: str = "float32", fp32_out: bool = True) -> torch.Tensor:
    """Target logits ``[..., V]`` from final hidden states ``[..., H]``, the matmul in ``dtype``.

    bfloat16 keeps a cached bf16 copy of the frozen head (AMX / tensor cores; the served target computes its
    logits in bf16 too); float32 is :meth:`TargetHead.logits` exactly. The result is fp32 unless ``fp32_out`` is
    False, when bf16 logits stay bf16 (for consumers that convert row chunks themselves, such as the streamed
    E2E-KL tree loss: the same values without an ``[R, V]`` fp32 copy).
    """
    from specopd_trainer.drafters.target_head import flat_matmul_t

    if dtype == "float32":
        return head.logits(hidden.float()).float()
    w = head.lm_head
    key = (w.data_ptr(), w.device, dtype)
    if key not in _HEAD_CACHE:
        _HEAD_CACHE.clear()
        _HEAD_CACHE[key] = w.to(torch.bfloat16)
    out = flat_matmul_t(hidden.to(torch.bfloat16), _HEAD_CACHE[key])
    return out.float() if fp32_out else out
