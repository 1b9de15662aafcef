"""A tiny random-initialised hybrid Gated DeltaNet target (Qwen3-Next architecture) with SmolLM2's tokenizer.

Issue 21 part 2: a small hybrid target SGLang serves on CPU. The layer pattern is Qwen3-Next's: three GDN
("linear_attention") layers per full-attention (GQA) layer. SGLang 0.5.23's ``qwen3_next`` loader builds every
decoder layer's MLP as a ``Qwen2MoeSparseMoeBlock`` (``is_layer_sparse = True`` unconditionally), so the MoE is
reduced to 2 tiny experts (both used, top-2) plus the shared expert. Weights are float32, drawn from
``torch.manual_seed(seed)`` through transformers' own ``Qwen3NextForCausalLM`` initialisation, so a seed gives
bit-identical weights. ``specopd models prepare tiny-qwen3next`` builds it (:mod:`sglang_specopd.app.models`).

The tokenizer files (and chat template) are copied from the prepared SmolLM2-135M-Instruct checkpoint, so the
four-domain data tokenises exactly as for the SmolLM2 target (vocab 49152, bos 1, eos 2).

torch / transformers are imported inside the functions only.
"""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# Three GDN layers per full-attention layer (Qwen3-Next: full_attention_interval = 4).
LAYER_TYPES = ("linear_attention",) * 3 + ("full_attention",)


def tiny_qwen3next_config(num_hidden_layers: int = 8, vocab_size: int = 49152):
    """The ``Qwen3NextConfig`` of the tiny hybrid target.

    Widths: hidden 256; full attention: 4 query heads, 2 KV heads (GQA), head_dim 64, partial RoPE (Qwen3-Next's
    0.25); GDN: 2 key heads x 32, 4 value heads x 32 (2 value heads per key head), conv kernel 4; MoE: 2 experts of
    width 128, both routed to every token (top-2 of 2; with top-1 the output jumps where the router's two
    logits tie, which fp32 rounding differences between implementations can flip), one shared expert of width
    128. ``num_hidden_layers`` must be a multiple of 4.

    Raises:
        ValueError: ``num_hidden_layers`` is not a positive multiple of 4.
    """
    from transformers import Qwen3NextConfig

    if num_hidden_layers <= 0 or num_hidden_layers % len(LAYER_TYPES):
        raise ValueError(f"num_hidden_layers must be a positive multiple of 4, got {num_hidden_layers}")
    config = Qwen3NextConfig(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=num_hidden_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
        initializer_range=0.05, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4,
        decoder_sparse_step=1, moe_intermediate_size=128, shared_expert_intermediate_size=128,
        num_experts_per_tok=2, num_experts=2, norm_topk_prob=True, mlp_only_layers=[],
        layer_types=list(LAYER_TYPES) * (num_hidden_layers // len(LAYER_TYPES)),
        bos_token_id=1, eos_token_id=2, pad_token_id=2, dtype="float32",
    )
    # SGLang's own Qwen3NextConfig derives the layer pattern from ``full_attention_interval`` (not ``layer_types``)
    # and reads ``rope_theta`` at the top level.
    config.full_attention_interval = len(LAYER_TYPES)
    config.rope_theta = 10000.0
    return config


def tokenizer_source(tokenizer_dir: Path) -> Path:
    """``tokenizer_dir`` as a Path, checked to hold ``tokenizer.json``. Raises FileNotFoundError otherwise."""
    tokenizer_dir = Path(tokenizer_dir)
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {tokenizer_dir}")
    return tokenizer_dir


def finish_checkpoint(out: Path, tokenizer_dir: Path) -> None:
    """Write the tiny targets' generation_config.json (SmolLM2's bos 1 / eos 2, greedy) and copy the tokenizer
    files of ``tokenizer_dir`` into the checkpoint directory ``out``."""
    from transformers import GenerationConfig

    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2, do_sample=False).save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, out / name)


def build_tiny_qwen3next(out: Path, tokenizer_dir: Path, *, seed: int = 0, num_hidden_layers: int = 8) -> Path:
    """Write the tiny hybrid target (config.json, model.safetensors, generation_config.json, tokenizer) to ``out``.

    Args:
        out: the checkpoint directory to create (must not exist or be empty).
        tokenizer_dir: a prepared SmolLM2 checkpoint whose tokenizer files are copied.
        seed: ``torch.manual_seed`` for the random initialisation (same seed, same weights).
        num_hidden_layers: a multiple of 4 (three GDN layers per full-attention layer).

    Returns: ``out``.

    Raises:
        FileNotFoundError: ``tokenizer_dir`` lacks ``tokenizer.json``.
        ValueError: bad ``num_hidden_layers``.
    """
    import torch
    from transformers import Qwen3NextForCausalLM

    tokenizer_dir = tokenizer_source(tokenizer_dir)
    config = tiny_qwen3next_config(num_hidden_layers)
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config).to(torch.float32).eval()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    finish_checkpoint(out, tokenizer_dir)
    return out
