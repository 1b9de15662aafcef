"""The tiny QSA-GDN target (:mod:`sglang_specopd.app.tiny.qsa`, Qwen4-Exp architecture), prepared by
``specopd models prepare tiny-qwen4exp[-sparse]``: layer pattern, deterministic from its seed, the checkpoint
reloads into transformers with the same logits, SGLang's config classes accept it, and the sparse variant really
selects (its logits equal the dense variant's while a query sees at most ``budget`` tokens, and differ after).
Needs the prepared SmolLM2 (skipped otherwise, see conftest)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_specopd.app import models
from sglang_specopd.app.tiny.qsa import (LAYER_TYPES, QSA_BUDGETS, build_tiny_qwen4exp, load_tiny_qwen4exp,
                                         make_tiny_qwen4exp, tiny_qwen4exp_config)

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def sparse_target(tmp_path_factory, smollm2_target: Path) -> Path:
    return build_tiny_qwen4exp(tmp_path_factory.mktemp("qsa") / "sparse", smollm2_target, seed=0,
                               budget=QSA_BUDGETS["sparse"])


def _ids(n: int, seed: int = 1) -> "torch.Tensor":
    return torch.randint(3, 49152, (1, n), generator=torch.Generator().manual_seed(seed))


def test_config_pattern_and_errors() -> None:
    cfg = tiny_qwen4exp_config(QSA_BUDGETS["sparse"], 8)
    # transformers maps the released checkpoints' "full_attention" to its indexed (QSA) attention
    assert cfg.layer_types == (["linear_attention"] * 3 + ["indexed_attention"]) * 2 and len(LAYER_TYPES) == 4
    assert (cfg.indexer_budget, cfg.indexer_compress_ratio, cfg.indexer_kv_heads) == (32, 4, 1)
    assert (cfg.hc_count, cfg.ple_layer_ids) == (2, [])
    with pytest.raises(ValueError, match="multiple of 4"):
        tiny_qwen4exp_config(32, 6)
    with pytest.raises(ValueError, match="budget"):
        tiny_qwen4exp_config(30, 8)


def test_checkpoint_reloads_with_the_same_logits(sparse_target: Path) -> None:
    built = make_tiny_qwen4exp(tiny_qwen4exp_config(QSA_BUDGETS["sparse"]), seed=0)
    built.config._attn_implementation = "eager"
    loaded = load_tiny_qwen4exp(sparse_target)
    # the redraw reached the Gemma-style norms (1 + w, w = 0 at init) and the hyper-connections
    layer = loaded.model.layers[3]
    assert layer.self_attn.indexer.k_layernorm.weight.abs().max() > 0.05
    assert layer.attn_hyper_connection.input_mix_weight_up.weight.std() > 0.05
    ids = _ids(48)
    with torch.no_grad():
        a, b = built(ids).logits, loaded(ids).logits
    assert torch.isfinite(a).all() and a.shape == (1, 48, 49152)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_sparse_budget_selects_past_budget_tokens(sparse_target: Path) -> None:
    """Same weights, budget 32 vs 2048: a query that sees <= 32 tokens attends to all of them either way (equal
    logits); past 32 the sparse model drops blocks, so its logits differ."""
    sparse = load_tiny_qwen4exp(sparse_target)
    dense = make_tiny_qwen4exp(tiny_qwen4exp_config(QSA_BUDGETS["dense"]), seed=0)
    dense.config._attn_implementation = "eager"
    dense.load_state_dict(sparse.state_dict())
    ids = _ids(64, seed=2)
    with torch.no_grad():
        s, d = sparse(ids).logits[0], dense(ids).logits[0]
    torch.testing.assert_close(s[:32], d[:32], rtol=0, atol=1e-5)
    assert (s[40:] - d[40:]).abs().amax(-1).min() > 1e-4


def test_sglang_config_classes_accept_it(sparse_target: Path, tmp_path: Path, smollm2_target: Path) -> None:
    from sglang.srt.configs.qwen4_exp import Qwen4ExpConfig
    from sglang.srt.layers.attention.qsa.config import parse_qsa_profile

    raw = json.loads((sparse_target / "config.json").read_text())
    assert raw["architectures"] == ["Qwen4ExpForConditionalGeneration"] and raw["language_model_only"] is True
    sparse_cfg = Qwen4ExpConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    text = sparse_cfg.text_config
    assert (text.hidden_size, text.hc_count, text.num_hidden_layers) == (256, 2, 8)
    assert [t for t in text.layers_block_type] == ["linear_attention"] * 3 + ["attention"] + \
        ["linear_attention"] * 3 + ["attention"]
    # budget 32 -> block top-k 8: a width SGLang's fast_topk_v2 lacks, so stock SGLang refuses it (CPU adaptation)
    with pytest.raises(ValueError, match="fast_topk_v2"):
        parse_qsa_profile(sparse_cfg)
    dense_raw = json.loads((sparse_target / "config.json").read_text())
    dense_raw["text_config"]["indexer_budget"] = QSA_BUDGETS["dense"]
    profile = parse_qsa_profile(Qwen4ExpConfig(**{k: v for k, v in dense_raw.items() if k != "model_type"}))
    assert (profile.budget, profile.compress_ratio, profile.block_topk, profile.n_heads) == (2048, 4, 512, 8)


def test_prepare_registers_both_variants() -> None:
    for name, builder in (("tiny-qwen4exp", "build_tiny_qwen4exp"),
                          ("tiny-qwen4exp-sparse", "build_tiny_qwen4exp_sparse")):
        spec = models.GENERATED_MODELS[name]
        assert (spec.module, spec.builder, spec.base) == ("tiny.qsa", builder, models.SMOLLM2.name)
