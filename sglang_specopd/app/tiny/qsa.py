"""A tiny random-initialised sparse-linear hybrid target (Qwen4-Exp architecture: GDN + QSA) with SmolLM2's tokenizer.

Issue 23 part 2 (step 1 of ``docs/qsa_serving_plan.md``): the smallest model with the structure of the SpecOPD
paper's largest target. Three Gated DeltaNet layers per sparse full-attention layer; each attention layer has a
QSA indexer (``indexer_*`` keys: 8 index query heads of width 32, one index key head, blocks of
``compress_ratio`` 4 consecutive keys mean-pooled, the ``budget / compress_ratio`` best blocks chosen per query by
``sum_h relu(q_h . k_block) / sqrt(Di)``, plus the incomplete tail block). Hyper-connections with 2 residual
streams, no per-layer n-gram embedding (PLE). Built with transformers' own ``Qwen4ExpForCausalLM`` (fp32,
``torch.manual_seed(seed)``), so a seed gives bit-identical weights.

Two budgets:
- ``budget 2048`` (``tiny-qwen4exp``): block top-k 512, a width SGLang 0.5.23's QSA profile accepts everywhere; a
  query sees every key (dense) up to 2048 tokens.
- ``budget 32`` (``tiny-qwen4exp-sparse``): block top-k 8, sparse from 33 visible tokens, so short prompts already
  exercise the selection. SGLang's profile check allows only block top-k 512 or 2048 (``fast_topk_v2``'s widths);
  serving this variant needs the CPU adaptation that lifts that check (plan, Q6).

Gemma-style norms (``1 + w``) start at ``w = 0`` and the hyper-connection weights at init values that hide
mistakes, so every norm weight and the hyper-connection projections are redrawn at random after init: a misnamed
tensor on the serving side then changes the logits.

``config.json`` is written in the layout SGLang routes on (``Qwen4ExpForConditionalGeneration`` with a nested
``text_config`` and ``language_model_only``); :func:`load_tiny_qwen4exp` reads it back into transformers'
``Qwen4ExpForCausalLM`` for reference logits. torch / transformers are imported inside the functions only.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

# Three GDN layers per (QSA) attention layer. "full_attention" is what released checkpoints write; transformers maps
# it to "indexed_attention" and SGLang to its attention layer with an indexer when ``indexer_n_heads`` is set.
LAYER_TYPES = ("linear_attention",) * 3 + ("full_attention",)
QSA_BUDGETS = {"dense": 2048, "sparse": 32}
COMPRESS_RATIO = 4


def tiny_qwen4exp_config(budget: int = QSA_BUDGETS["dense"], num_hidden_layers: int = 8, vocab_size: int = 49152):
    """The ``Qwen4ExpTextConfig`` of the tiny QSA-GDN target.

    Widths as the tiny Qwen3-Next target (:mod:`sglang_specopd.app.tiny.hybrid`): hidden 256; attention: 4 query
    heads, 2 KV heads (GQA), head_dim 64, partial RoPE 0.25 (rotary dim 16 <= the index head width, as QSA requires);
    GDN: 2 key heads x 32, 4 value heads x 32; MoE: 2 experts of width 128, top-2, one shared expert of width 128.
    Hyper-connections: 2 streams, rank 16. QSA: 8 index heads x 32, 1 index key head, ``budget`` tokens selected in
    blocks of 4.

    Raises:
        ValueError: ``num_hidden_layers`` is not a positive multiple of 4, or ``budget`` is not a positive multiple
            of 4.
    """
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

    if num_hidden_layers <= 0 or num_hidden_layers % len(LAYER_TYPES):
        raise ValueError(f"num_hidden_layers must be a positive multiple of 4, got {num_hidden_layers}")
    if budget <= 0 or budget % COMPRESS_RATIO:
        raise ValueError(f"budget must be a positive multiple of {COMPRESS_RATIO}, got {budget}")
    return Qwen4ExpTextConfig(
        vocab_size=vocab_size, hidden_size=256, num_hidden_layers=num_hidden_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
        initializer_range=0.05, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4,
        moe_intermediate_size=128, shared_expert_intermediate_size=128, num_experts_per_tok=2, num_experts=2,
        norm_topk_prob=True, hc_count=2, hc_lowrank=16, ple_layer_ids=[],
        indexer_n_heads=8, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=budget,
        indexer_compress_ratio=COMPRESS_RATIO, output_gate_type="sigmoid",
        layer_types=list(LAYER_TYPES) * (num_hidden_layers // len(LAYER_TYPES)),
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )


def _redraw(model, seed: int) -> None:
    """Redraw norm weights (around 0: Gemma-style ``1 + w``) and hyper-connection projections at random."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and "linear_attn.norm" not in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif "linear_attn.norm.weight" in name:  # the GDN gated norm multiplies by w (starts at 1)
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "hyper_connection" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def make_tiny_qwen4exp(config, seed: int = 0):
    """transformers' ``Qwen4ExpForCausalLM`` for ``config`` (a :func:`tiny_qwen4exp_config`), fp32, eval,
    initialised from ``torch.manual_seed(seed)`` with norms and hyper-connections redrawn: the weights
    :func:`build_tiny_qwen4exp` writes."""
    import torch
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForCausalLM

    torch.manual_seed(seed)
    model = Qwen4ExpForCausalLM(config).to(torch.float32).eval()
    _redraw(model, seed)
    return model


def sglang_config(text_config) -> dict:
    """The ``config.json`` SGLang 0.5.23 routes a text-only Qwen4-Exp on: ``Qwen4ExpForConditionalGeneration``,
    ``model_type qwen4_exp``, the text keys nested under ``text_config``, ``language_model_only`` (no vision tower,
    no multimodal processor)."""
    text = text_config.to_dict()
    text["model_type"] = "qwen4_exp_text"
    # SGLang's Qwen3Next-derived text config reads these at the top level of the text config.
    text["rope_theta"] = text["rope_parameters"]["rope_theta"]
    text["partial_rotary_factor"] = text["rope_parameters"]["partial_rotary_factor"]
    text["full_attention_interval"] = len(LAYER_TYPES)  # read by qwen3_5's per-layer RoPE refresh
    return {"architectures": ["Qwen4ExpForConditionalGeneration"], "model_type": "qwen4_exp",
            "language_model_only": True, "tie_word_embeddings": False, "text_config": text,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "torch_dtype": "float32"}


def build_tiny_qwen4exp(out: Path, tokenizer_dir: Path, *, seed: int = 0, budget: int = QSA_BUDGETS["dense"],
                        num_hidden_layers: int = 8) -> Path:
    """Write the tiny QSA-GDN target (config.json, model.safetensors, generation_config.json, tokenizer) to ``out``.

    Args:
        out: the checkpoint directory to create (must not exist or be empty).
        tokenizer_dir: a prepared SmolLM2 checkpoint whose tokenizer files are copied.
        seed: ``torch.manual_seed`` for the random initialisation (same seed, same weights).
        budget: QSA tokens selected per query (2048: dense up to 2048 tokens; 32: sparse from 33).
        num_hidden_layers: a multiple of 4 (three GDN layers per QSA attention layer).

    Returns: ``out``.

    Raises:
        FileNotFoundError: ``tokenizer_dir`` lacks ``tokenizer.json``.
        ValueError: bad ``num_hidden_layers`` or ``budget``.
    """
    from sglang_specopd.app.tiny.hybrid import finish_checkpoint, tokenizer_source

    tokenizer_dir = tokenizer_source(tokenizer_dir)
    config = tiny_qwen4exp_config(budget, num_hidden_layers)
    model = make_tiny_qwen4exp(config, seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "config.json").write_text(json.dumps(sglang_config(config), indent=2, sort_keys=True) + "\n")
    finish_checkpoint(out, tokenizer_dir)
    return out


def build_tiny_qwen4exp_sparse(out: Path, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    """:func:`build_tiny_qwen4exp` with ``budget 32`` (sparse from 33 visible tokens)."""
    return build_tiny_qwen4exp(out, tokenizer_dir, seed=seed, budget=QSA_BUDGETS["sparse"])


def load_tiny_qwen4exp(path: Path):
    """The checkpoint at ``path`` as transformers' ``Qwen4ExpForCausalLM`` (fp32, eval, eager attention): the
    reference the served model is compared with. Reads the nested ``text_config`` of the SGLang-layout config.json.

    Raises:
        FileNotFoundError: no config.json under ``path``.
        ValueError: a tensor is missing, unexpected or of the wrong shape.
    """
    import torch
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForCausalLM

    path = Path(path)
    raw = json.loads((path / "config.json").read_text())
    text = {k: v for k, v in raw["text_config"].items()
            if k not in ("model_type", "rope_theta", "partial_rotary_factor", "transformers_version")}
    config = Qwen4ExpTextConfig(**text)
    # from_pretrained (not load_state_dict): save_pretrained wrote transformers' checkpoint layout (per-expert
    # tensors), which its conversion mapping folds back into the fused expert parameters.
    model, info = Qwen4ExpForCausalLM.from_pretrained(path, config=config, dtype=torch.float32,
                                                      attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ValueError(f"{path}: checkpoint does not match its config: {bad}")
    return model.eval()


@contextlib.contextmanager
def served_index_precision(dtype=None):
    """Within the block, transformers' Qwen4-Exp QSA indexer scores with its query and its compressed block keys
    rounded to ``dtype`` after RoPE, as SGLang 0.5.23 serves them (its compressed key cache and the cast of the
    index query are bf16 even on an fp32 server: ``qsa_indexer.py`` ``project_qk`` / ``set_qsa_compressed_k_buffer``).
    Without this, a query whose 8th and 9th best blocks score within bf16 rounding (~0.4% relative) can select
    another block than the served model, and everything after it differs. Default dtype: bfloat16.

    The indexer is the only caller of ``apply_rotary_pos_emb`` with one tensor (the attention passes q and k), which
    is where the rounding goes. Blocks the server completes during decode are pooled from its bf16 key ring (token
    keys rounded before pooling); this reference pools fp32 token keys, as the server's prefill does.
    """
    import torch
    from transformers.models.qwen4_exp import modeling_qwen4_exp as mq

    dtype = dtype or torch.bfloat16
    real = mq.apply_rotary_pos_emb

    def rounded(q, k=None, cos=None, sin=None, unsqueeze_dim=1):
        out = real(q, k, cos, sin, unsqueeze_dim)
        return out.to(dtype).to(q.dtype) if k is None else out

    mq.apply_rotary_pos_emb = rounded
    try:
        yield
    finally:
        mq.apply_rotary_pos_emb = real
