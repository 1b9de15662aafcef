"""Tests of sglang_specopd.app.models / tiny_target / gguf_convert (offline; the SmolLM2 test needs the prepared model)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_specopd.app import models
from sglang_specopd.app.models import TargetNotFoundError, list_prepared, resolve_target
from _tiny_target import make_tiny_target
from _tiny_target import RESERVED_MASK_TOKEN, TinyTargetError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_target(tmp_path_factory.mktemp("t") / "llama", seed=0)


def test_tiny_target_files_and_config(tiny_llama: Path) -> None:
    names = sorted(p.name for p in tiny_llama.iterdir())
    assert names == ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json"]
    cfg = json.loads((tiny_llama / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"]) == (64, 4, 4, 2, 16)
    assert cfg["tie_word_embeddings"] is True
    assert cfg["dtype"] == "float32"
    assert 900 <= cfg["vocab_size"] <= 1024
    # bos/eos/pad are the ids of the special tokens written first by the BPE trainer
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (0, 2, 3)


def test_tiny_target_loads_and_generates(tiny_llama: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    assert model.dtype == torch.float32
    assert tok.bos_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    assert tok.convert_tokens_to_ids(RESERVED_MASK_TOKEN) == 4
    text = "Return the sum of the arguments."
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level BPE round trip
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 5)
    assert torch.equal(out[0, : ids.shape[1]], ids[0])
    assert int(out[0, ids.shape[1]:].max()) < model.config.vocab_size


def test_tiny_target_deterministic_and_seeded(tmp_path: Path, tiny_llama: Path) -> None:
    def digest(p: Path) -> str:
        return hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest()

    again = make_tiny_target(tmp_path / "again", seed=0)
    other = make_tiny_target(tmp_path / "other", seed=1)
    assert digest(again) == digest(tiny_llama)
    assert digest(other) != digest(tiny_llama)
    assert (again / "tokenizer.json").read_bytes() == (tiny_llama / "tokenizer.json").read_bytes()


def test_tiny_qwen3_untied_with_qk_norm(tmp_path: Path) -> None:
    from safetensors import safe_open

    out = make_tiny_target(tmp_path / "q", arch="qwen3", num_layers=2)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["tie_word_embeddings"] is False
    with safe_open(out / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("model.layers.0.self_attn.q_norm.weight").tolist() == [1.0] * 16
    assert "lm_head.weight" in keys and "model.layers.1.self_attn.k_norm.weight" in keys


def test_tiny_target_errors(tmp_path: Path, tiny_llama: Path) -> None:
    with pytest.raises(TinyTargetError, match="already exists"):
        make_tiny_target(tiny_llama)
    with pytest.raises(TinyTargetError, match="arch must be"):
        make_tiny_target(tmp_path / "x", arch="gpt2")
    with pytest.raises(TinyTargetError, match="num_heads=3 must divide hidden_size=64"):
        make_tiny_target(tmp_path / "y", num_heads=3)
    with pytest.raises(TinyTargetError, match="smaller than the tokenizer"):
        make_tiny_target(tmp_path / "z", vocab_size=100)
    assert not (tmp_path / "x").exists() and not (tmp_path / "z").exists()


def test_resolve_target(tmp_path: Path, tiny_llama: Path) -> None:
    assert resolve_target(str(tiny_llama)) == tiny_llama
    with pytest.raises(TargetNotFoundError, match=f"target path does not exist: {tmp_path / 'nope'}"):
        resolve_target(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TargetNotFoundError, match="no config.json"):
        resolve_target(tmp_path / "empty")
    with pytest.raises(TargetNotFoundError, match="run `specopd models prepare smollm2` first"):
        resolve_target("smollm2", home=tmp_path / "home")


def test_list_prepared_reads_markers(tmp_path: Path) -> None:
    assert list_prepared(tmp_path) == []
    d = tmp_path / "models" / "SmolLM2-135M-Instruct"
    d.mkdir(parents=True)
    (d / models.MARKER_NAME).write_text(json.dumps({"dtype": "bfloat16", "files": {}}))
    assert list_prepared(tmp_path) == [models.PreparedModel("smollm2", d, "bfloat16")]


def test_prepare_rejects_unknown_name_and_dtype(tmp_path: Path) -> None:
    with pytest.raises(models.PrepareError, match="unknown model 'gpt5'"):
        models.prepare_model("gpt5", home=tmp_path)
    with pytest.raises(models.PrepareError, match="unsupported dtype 'int8'"):
        models.prepare_model("smollm2", home=tmp_path, dtype="int8")


def test_tiny_qwen3_fixture_and_cli_resolve_error(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    # the tiny random targets are a test fixture (tests/_tiny_target.py), not a product command
    assert make_tiny_target(tmp_path / "t", arch="qwen3") == tmp_path / "t"
    _register_subcommands()
    runner = CliRunner()
    res = runner.invoke(app, ["models", "make-tiny", "--out", str(tmp_path / "u")])
    assert res.exit_code != 0 and not (tmp_path / "u").exists()
    res = runner.invoke(app, ["models", "prepare", "nosuch", "--home", str(tmp_path)])
    assert res.exit_code == 2 and "error: unknown model 'nosuch'" in res.output
    assert "Traceback" not in res.output


# ---------------------------------------------------------------- the real SmolLM2 target (prepared by CI first)

SMOL_DIR = Path(os.environ.get("SPECOPD_HOME", Path.home() / ".cache" / "specopd")) / "models" / "SmolLM2-135M-Instruct"


@pytest.mark.smollm2
@pytest.mark.skipif(not (SMOL_DIR / models.MARKER_NAME).is_file() and os.environ.get("SPECOPD_PREPARE") != "1",
                    reason="SmolLM2 not prepared (run `specopd models prepare smollm2` or set SPECOPD_PREPARE=1)")
def test_smollm2_prepared_and_idempotent() -> None:
    cmd = [sys.executable, "-c", "from sglang_specopd.app.cli.entry import main; main()", "models", "prepare", "smollm2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert first.returncode == 0, first.stderr
    start = time.monotonic()
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    elapsed = time.monotonic() - start
    assert second.returncode == 0, second.stderr
    path = Path(second.stdout.strip().splitlines()[-1])
    assert path == resolve_target("smollm2")
    assert "checksums match" in second.stderr
    assert elapsed < 4.0  # < 2 s on an idle machine; headroom for a loaded CI box
    cfg = json.loads((path / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["vocab_size"], cfg["tie_word_embeddings"]) == (576, 30, 9, 3, 49152, True)
    marker = json.loads((path / models.MARKER_NAME).read_text())
    assert marker["wheel_sha256"] == models.SMOLLM2.wheel_sha256
    assert marker["files"]["model.safetensors"] == models.sha256_file(path / "model.safetensors")
    assert {"config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja"} <= set(marker["files"])


@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.skipif(not (SMOL_DIR / models.MARKER_NAME).is_file(), reason="SmolLM2 not prepared")
def test_smollm2_generates_english() -> None:
    from sglang_specopd.app.gguf_convert import verify_checkpoint

    text = verify_checkpoint(SMOL_DIR, max_new_tokens=8)
    assert "Paris" in text


def test_corrupted_marker_is_not_verified(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"abc")
    files = {"model.safetensors": hashlib.sha256(b"abc").hexdigest()}
    marker = {"wheel_sha256": models.SMOLLM2.wheel_sha256, "dtype": "float32", "files": files}
    (d / models.MARKER_NAME).write_text(json.dumps(marker))
    assert models._verify_marker(d, models.SMOLLM2, "float32") is True
    assert models._verify_marker(d, models.SMOLLM2, "bfloat16") is False  # another dtype -> rebuild
    (d / "model.safetensors").write_bytes(b"abd")  # corrupted -> rebuild
    assert models._verify_marker(d, models.SMOLLM2, "float32") is False
    (d / models.MARKER_NAME).write_text("{not json")
    assert models._verify_marker(d, models.SMOLLM2, "float32") is False
