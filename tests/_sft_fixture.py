"""A tiny synthetic SFT setup (drafter + random target head + sequences) for trainer tests; no server, no files."""

from __future__ import annotations

import torch

from sglang_specopd.wire.drafters.format import DrafterSpec


TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            intermediate_size=64, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=97, max_position_embeddings=512,
            block_size=4, target_layer_ids=(1,), mask_token="<m>", mask_token_id=3, num_target_layers=4)
ARCHS = ("dflash", "dflash2", "dspark")


def tiny_spec(arch: str = "dflash") -> DrafterSpec:
    """The tiny drafter's spec for a registered architecture (V2: groups of 8 channels, rank 4, top-8; DSpark:
    Markov rank 4, the rnn head, so a slot depends on every earlier drafted token)."""
    if arch == "dflash2":
        from sglang_specopd.wire.drafters.dflash2 import DFlash2Spec

        return DFlash2Spec(**TINY, conv_group_size=8, selector_rank=4, selector_top_k=8)
    if arch == "dspark":
        from sglang_specopd.wire.drafters.dspark import DSparkSpec

        return DSparkSpec(**TINY, markov_rank=4, markov_head_type="rnn")
    return DrafterSpec(**TINY)


def tiny_drafter(seed: int = 0, arch: str = "dflash"):
    """A tiny drafter of ``arch`` on a random tied head (vocab 97, hidden 32, block 4). V2 / DSpark get a random
    selector / Markov output (near zero at init), so their slots really depend on earlier drafted tokens."""
    from specopd_trainer.drafters.registry import get_drafter_class
    from specopd_trainer.drafters.target_head import TargetHead

    g = torch.Generator().manual_seed(123)
    embed = torch.randn(97, 32, generator=g)
    d = get_drafter_class(arch)(tiny_spec(arch), seed=seed, target_head=TargetHead(embed, embed))
    scales = {"dflash2": {"candidate_selector.successor_codebook": 1.0, "candidate_selector.predecessor_codebook": 1.0,
                          "candidate_selector.hidden_projection.weight": 0.3},
              "dspark": {"markov_head.markov_w2.weight": 4.0}}.get(arch, {})
    gen = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():  # path terms comparable to the head logits (std ~7 here), not ~0 as at init
        for name, scale in scales.items():
            w = d.get_parameter(name)
            w.copy_(scale * torch.randn(w.shape, generator=gen))
    return d


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
