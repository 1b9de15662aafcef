"""The tiny hybrid Gated DeltaNet target (:mod:`sglang_specopd.app.tiny.hybrid`), prepared by
``specopd models prepare tiny-qwen3next``: Qwen3-Next layer pattern, deterministic from its seed, SmolLM2's
tokenizer, and transformers runs it. Needs the prepared SmolLM2 (skipped otherwise, see conftest)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from sglang_specopd.app import models
from sglang_specopd.app.tiny.hybrid import LAYER_TYPES, tiny_qwen3next_config


def _home_with_smollm2(tmp_path: Path, smollm2_target: Path) -> Path:
    """A specopd home whose SmolLM2 (and its pinned wheel) are links to the prepared ones."""
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "wheels").mkdir()
    os.symlink(smollm2_target, home / "models" / smollm2_target.name)
    wheel = smollm2_target.parent.parent / "wheels" / models.SMOLLM2.wheel_file
    if not wheel.is_file():
        pytest.skip(f"the pinned SmolLM2 wheel is not in {wheel.parent}")
    os.symlink(wheel, home / "wheels" / wheel.name)
    return home


def test_config_layer_pattern_and_errors() -> None:
    cfg = tiny_qwen3next_config(8)
    assert cfg.layer_types == list(LAYER_TYPES) * 2 and cfg.full_attention_interval == 4
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)  # GQA
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (2, 4)
    with pytest.raises(ValueError, match="multiple of 4"):
        tiny_qwen3next_config(6)


def test_prepare_is_deterministic_idempotent_and_resolvable(tmp_path: Path, smollm2_target: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    home = _home_with_smollm2(tmp_path, smollm2_target)
    path = models.prepare_model("tiny-qwen3next", home=home)
    assert path == models.resolve_target("tiny-qwen3next", home=home)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3NextForCausalLM"] and cfg["dtype"] == "float32"
    assert cfg["vocab_size"] == 49152 and cfg["layer_types"].count("linear_attention") == 6
    marker = json.loads((path / models.MARKER_NAME).read_text())
    assert (marker["model"], marker["seed"], marker["base"]) == ("tiny-qwen3next", 0, "smollm2")
    names = {m.name for m in models.list_prepared(home)}
    assert {"smollm2", "tiny-qwen3next"} <= names
    first = load_file(str(path / "model.safetensors"))
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert models.prepare_model("tiny-qwen3next", home=home) == path  # verified, not rebuilt
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    # A rebuild from scratch gives bit-identical weights (seeded).
    shutil.rmtree(path)
    again = load_file(str(models.prepare_model("tiny-qwen3next", home=home) / "model.safetensors"))
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    with pytest.raises(models.PrepareError, match="float32"):
        models.prepare_model("tiny-qwen3next", home=home, dtype="bfloat16")
    # SmolLM2's tokenizer, and transformers runs the checkpoint.
    tok = AutoTokenizer.from_pretrained(path)
    assert tok("Hello").input_ids == AutoTokenizer.from_pretrained(smollm2_target)("Hello").input_ids
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tok("The sea is").input_ids])).logits
    assert logits.shape[-1] == 49152 and torch.isfinite(logits).all()
