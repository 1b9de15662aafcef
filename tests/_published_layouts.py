"""Drafter config.json files in the layouts drafters are published in, shrunk to a tiny target (for tests).

Each layout is re-typed from a public config (keys, nesting and kinds of values as published; dimensions shrunk
to the tiny Qwen3 target of ``tests/test_published_drafters.py``: hidden 64, 4 / 2 heads of 16, 6 layers,
a 1,024-token tokenizer in a 1,088-row vocabulary, like Qwen3's 151,669 tokens in 151,936 rows):

* ``zlab_qwen3``: the DFlash authors' ``z-lab/Qwen3-8B-DFlash-b16`` style (transformers 4 keys: top-level
  ``block_size`` and ``rope_theta``, ``rope_scaling: null``, ``auto_map``; ``dflash_config`` with only
  ``mask_token_id`` (the id SGLang gives an added ``<|MASK|>``: the tokenizer's length) and ``target_layer_ids``);
* ``zlab_qwen35``: ``z-lab/Qwen3.5-*-DFlash`` style (transformers 5: ``rope_parameters``; ``block_size`` inside
  ``dflash_config``; no ``num_target_layers``; ``use_sliding_window`` with a window but no sliding layer);
* ``specforge_dflash``: SpecForge's ``configs/qwen3-8b-dflash.json`` (no ``dflash_config`` at all);
* ``specforge_dflash2``: SpecForge's ``configs/qwen3.6-27b-dflash2.json`` (DFlash V2, ``is_causal: false``,
  sliding-window layers);
* ``specforge_dspark``: SpecForge's ``configs/qwen3-8b-dspark.json`` (the Markov keys inside ``dflash_config``);
* ``speculators_dflash``: a vLLM ``speculators`` DFlash export (``speculators_model_type``, nested
  ``transformer_layer_config``, no ``model_type``).
"""

from __future__ import annotations

import copy
from typing import Any

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, TOKENIZER_LEN, TARGET_LAYERS = 64, 4, 2, 16, 128, 1088, 1024, 6
DRAFT_LAYERS = 2

_QWEN3_BODY: dict[str, Any] = {
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 2,
    "head_dim": HEAD_DIM, "hidden_act": "silu", "hidden_size": HIDDEN, "initializer_range": 0.02,
    "intermediate_size": INTER, "max_position_embeddings": 4096, "model_type": "qwen3",
    "num_attention_heads": HEADS, "num_hidden_layers": DRAFT_LAYERS, "num_key_value_heads": KV_HEADS,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "use_cache": True, "vocab_size": VOCAB,
}

LAYOUTS: dict[str, dict[str, Any]] = {
    "zlab_qwen3": {
        "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": 16, **_QWEN3_BODY,
        "dflash_config": {"mask_token_id": TOKENIZER_LEN, "target_layer_ids": [1, 3]},
        "dtype": "bfloat16", "layer_types": ["full_attention"] * DRAFT_LAYERS, "max_window_layers": DRAFT_LAYERS,
        "num_target_layers": TARGET_LAYERS, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "transformers_version": "4.57.3", "use_sliding_window": False,
    },
    "zlab_qwen35": {
        "architectures": ["DFlashDraftModel"], **_QWEN3_BODY, "dtype": "bfloat16",
        "dflash_config": {"block_size": 16, "mask_token_id": TOKENIZER_LEN, "target_layer_ids": [1, 2, 4]},
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000}, "use_sliding_window": True,
        "sliding_window": 4096,
    },
    "specforge_dflash": {
        "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "modeling_dflash.DFlashDraftModel"},
        "block_size": 16, **_QWEN3_BODY, "dtype": "bfloat16", "layer_types": ["full_attention"] * DRAFT_LAYERS,
        "max_window_layers": DRAFT_LAYERS, "num_target_layers": TARGET_LAYERS, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "use_sliding_window": False,
    },
    "specforge_dflash2": {
        "architectures": ["DFlash2DraftModel"], **_QWEN3_BODY, "is_causal": False, "bos_token_id": None,
        "dflash_config": {"block_size": 8, "conv_group_size": 16, "conv_kernel_size": 2,
                          "mask_token_id": TOKENIZER_LEN, "selector_rank": 8, "selector_top_k": 4,
                          "target_layer_ids": [1, 3]},
        "dtype": "bfloat16", "layer_types": ["sliding_attention"] * DRAFT_LAYERS, "max_window_layers": DRAFT_LAYERS,
        "num_target_layers": TARGET_LAYERS, "pad_token_id": 2,
        "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"}, "sliding_window": 32,
        "transformers_version": "5.8.1", "use_sliding_window": True,
    },
    "specforge_dspark": {
        "architectures": ["DSparkDraftModel"], "auto_map": {"AutoModel": "dspark.DSparkDraftModel"},
        "block_size": 16, **_QWEN3_BODY,
        "dflash_config": {"mask_token_id": TOKENIZER_LEN, "target_layer_ids": [1, 3], "projector_type": "dspark",
                          "markov_rank": 8, "markov_head_type": "vanilla", "confidence_head_alpha": 1.0,
                          "enable_confidence_head": True, "confidence_head_with_markov": True},
        "dtype": "bfloat16", "layer_types": ["full_attention"] * DRAFT_LAYERS, "max_window_layers": DRAFT_LAYERS,
        "num_target_layers": TARGET_LAYERS, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "use_sliding_window": False,
    },
    "speculators_dflash": {
        "speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"], "block_size": 8,
        "draft_vocab_size": 512, "mask_token_id": TOKENIZER_LEN, "aux_hidden_state_layer_ids": [1, 3],
        "sliding_window_non_causal": False, "target_hidden_size": HIDDEN,
        "transformer_layer_config": {**_QWEN3_BODY},
        "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 7}],
                               "verifier": {"name_or_path": "Qwen/Qwen3-8B", "architectures": ["Qwen3ForCausalLM"]}},
    },
}

# What SGLang serves for each layout on the tiny target (tests compare this module's claims with SGLang too):
# None = refused. Values: (block size or DSpark gamma, target layer ids, mask token, mask token id).
EXPECTED: dict[str, Any] = {
    "zlab_qwen3": (16, [1, 3], "<|MASK|>", TOKENIZER_LEN),
    "zlab_qwen35": (16, [1, 2, 4], "<|MASK|>", TOKENIZER_LEN),
    "specforge_dflash": (16, [1, 3], "<|MASK|>", TOKENIZER_LEN),
    "specforge_dflash2": (8, [1, 3], "<|MASK|>", TOKENIZER_LEN),
    "specforge_dspark": None,
    "speculators_dflash": None,
}


def layout(name: str) -> dict[str, Any]:
    """A deep copy of the layout ``name`` (tests edit it)."""
    return copy.deepcopy(LAYOUTS[name])
