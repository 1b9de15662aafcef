"""A tiny synthetic SFT setup (drafter + random target head + sequences) for trainer tests; no server, no files."""

from __future__ import annotations

import torch

from sglang_specopd.wire.drafter_format import DrafterSpec


def tiny_spec() -> DrafterSpec:
    return DrafterSpec(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, intermediate_size=64, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=97,
                       max_position_embeddings=512, block_size=4, target_layer_ids=(1,), mask_token="<m>",
                       mask_token_id=3, num_target_layers=4)


def tiny_drafter(seed: int = 0):
    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.drafters.target_head import TargetHead

    g = torch.Generator().manual_seed(123)
    embed = torch.randn(97, 32, generator=g)
    return DFlashDrafter(tiny_spec(), seed=seed, target_head=TargetHead(embed, embed))


def tiny_sequences(n: int = 6, length: int = 40):
    from specopd_trainer.features import Sequence

    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(n):
        ids = torch.randint(4, 97, (length,), generator=g)
        ids[1::2] = ids[0::2] % 50 + 4  # learnable structure: odd tokens follow even ones
        out.append(Sequence(id=f"s{i}", domain="synthetic", token_ids=ids,
                            features=torch.randn(length, 32, generator=g), prompt_len=8))
    return out
