"""Tests of the DFlash drafter format: layer ids, tensor layout, init, check, CLI, and SGLang's own parser/loader."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from sglang_specopd.app.drafters.check import DrafterCheckError, Problem, assert_drafter_ok, check_drafter
from sglang_specopd.app.drafters.check import check_drafter_report
from sglang_specopd.wire.drafters.format import (
    DrafterConfigError,
    DrafterSpec,
    DrafterSpecError,
    default_target_layer_ids,
    drafter_config,
    expected_tensors,
    spec_from_config,
)
from sglang_specopd.wire.drafters.init import DrafterInitError, MaskTokenError, init_drafter, pick_mask_token
from _tiny_target import make_tiny_target

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def target(tiny_target6: Path) -> Path:
    return tiny_target6


@pytest.fixture(scope="module")
def drafter(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("drf") / "d"
    init_drafter(target, out, block_size=8, num_layers=2, seed=0)
    return out


def _spec(**kw) -> DrafterSpec:
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=128, rms_norm_eps=1e-5, rope_theta=10000.0, vocab_size=1024,
                max_position_embeddings=2048, block_size=8, target_layer_ids=(1, 3), mask_token="<m>",
                mask_token_id=4, num_target_layers=6)
    return DrafterSpec(**{**base, **kw})


@pytest.mark.parametrize(("n", "layers", "want"), [
    (30, 1, [15]), (30, 2, [1, 27]), (30, 3, [1, 14, 27]), (36, 5, [1, 9, 17, 25, 33]),
    (32, 4, [1, 10, 20, 29]), (8, 3, [1, 3, 5]), (6, 2, [1, 3]), (4, 1, [2]), (3, 1, [1]),
])
def test_default_target_layer_ids(n: int, layers: int, want: list[int]) -> None:
    got = default_target_layer_ids(n, layers)
    assert got == want
    assert n - 1 not in got


@pytest.mark.parametrize(("n", "layers", "match"), [
    (4, 2, "cannot spread 2 distinct context layers over target layers 1..1"),
    (6, 4, "cannot spread 4"), (2, 1, ">= 3 layers"), (30, 0, "must be >= 1"),
])
def test_default_target_layer_ids_errors(n: int, layers: int, match: str) -> None:
    with pytest.raises(DrafterSpecError, match=match):
        default_target_layer_ids(n, layers)


def test_expected_tensors_layout() -> None:
    got = expected_tensors(_spec())
    assert len(got) == 11 * 2 + 3
    assert got["layers.1.self_attn.q_proj.weight"] == (64, 64)
    assert got["layers.1.self_attn.k_proj.weight"] == (32, 64)
    assert got["layers.0.self_attn.v_proj.weight"] == (32, 64)
    assert got["layers.0.self_attn.o_proj.weight"] == (64, 64)
    assert got["layers.0.self_attn.q_norm.weight"] == (16,)
    assert got["layers.0.mlp.gate_proj.weight"] == (128, 64)
    assert got["layers.0.mlp.down_proj.weight"] == (64, 128)
    assert got["fc.weight"] == (64, 2 * 64)
    assert got["hidden_norm.weight"] == (64,) and got["norm.weight"] == (64,)
    assert not any("embed" in k or "lm_head" in k or k.endswith(".bias") for k in got)


def test_spec_validation_and_config_round_trip() -> None:
    spec = _spec()
    assert spec_from_config(json.loads(json.dumps(drafter_config(spec)))) == spec
    with pytest.raises(DrafterSpecError) as err:
        _spec(block_size=1, target_layer_ids=(3, 5), mask_token_id=5000)
    codes = [c for c, _ in err.value.problems]
    assert codes == ["block_size_too_small", "mask_token_out_of_vocab", "layer_id_is_last"]
    cfg = drafter_config(spec)
    del cfg["hidden_size"], cfg["dflash_config"]["mask_token"]
    with pytest.raises(DrafterConfigError) as err:
        spec_from_config(cfg)
    assert [m for _, m in err.value.problems] == ["config.json is missing key hidden_size",
                                                   "config.json is missing key dflash_config.mask_token"]
    cfg = drafter_config(spec)
    del cfg["dflash_config"]
    cfg["architectures"] = ["LlamaForCausalLM"]
    with pytest.raises(DrafterConfigError) as err:
        spec_from_config(cfg)
    assert [c for c, _ in err.value.problems] == ["config_invalid", "config_key_missing"]
    assert "architectures must be ['DFlashDraftModel']" in str(err.value)


def test_init_then_check_ok(target: Path, drafter: Path) -> None:
    cfg = json.loads((drafter / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["num_target_layers"] == 6 and cfg["num_hidden_layers"] == 2
    assert cfg["dflash_config"] == {"block_size": 8, "target_layer_ids": [1, 3],
                                    "mask_token": "<|reserved_special_token_0|>", "mask_token_id": 4}
    assert cfg["layer_types"] == ["full_attention", "full_attention"] and "is_causal" not in cfg
    assert check_drafter(drafter, target) == []
    spec = assert_drafter_ok(drafter, target)
    assert spec.target_layer_ids == (1, 3) and spec.hidden_size == 64
    from safetensors.torch import load_file

    sd = load_file(drafter / "model.safetensors")
    assert set(sd) == set(expected_tensors(spec))
    assert sd["norm.weight"].tolist() == [1.0] * 64
    assert 0.015 < float(sd["layers.0.mlp.up_proj.weight"].std()) < 0.025


def test_init_deterministic_force_and_errors(target: Path, drafter: Path, tmp_path: Path) -> None:
    same = tmp_path / "same"
    init_drafter(target, same, seed=0)
    assert (same / "model.safetensors").read_bytes() == (drafter / "model.safetensors").read_bytes()
    init_drafter(target, same, seed=1, overwrite=True)
    assert (same / "model.safetensors").read_bytes() != (drafter / "model.safetensors").read_bytes()
    with pytest.raises(DrafterInitError, match="already exists"):
        init_drafter(target, same)
    with pytest.raises(MaskTokenError, match="'<nope>' is not a single token"):
        init_drafter(target, tmp_path / "m", mask_token="<nope>")
    with pytest.raises(DrafterSpecError, match="block_size must be an int >= 2"):
        init_drafter(target, tmp_path / "b", block_size=1)
    spec = init_drafter(target, tmp_path / "o", mask_token="<|pad|>", target_layer_ids=[2, 4])
    assert (spec.mask_token, spec.mask_token_id, spec.target_layer_ids) == ("<|pad|>", 3, (2, 4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "same"]  # failures leave nothing behind


def test_four_layer_target_gets_one_context_layer(tmp_path: Path) -> None:
    tgt = make_tiny_target(tmp_path / "t4", num_layers=4)
    spec = init_drafter(tgt, tmp_path / "d", num_layers=2)
    assert spec.target_layer_ids == (2,) and spec.num_context_features == 1
    assert check_drafter(tmp_path / "d", tgt) == []


def test_pick_mask_token_smollm2_vocabulary() -> None:
    smol = [(0, "<|endoftext|>"), (1, "<|im_start|>"), (2, "<|im_end|>"), (3, "<repo_name>"), (5, "<file_sep>"),
            (14, "<jupyter_output>"), (16, "<empty_output>")]
    assert pick_mask_token(smol, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) == ("<empty_output>", 16)
    assert pick_mask_token([(7, "<|reserved_9|>"), (5, "<|reserved_2|>")], set()) == ("<|reserved_2|>", 5)
    with pytest.raises(MaskTokenError, match="pass --mask-token"):
        pick_mask_token([(0, "<s>")], {"<s>"})


# ------------------------------------------------------------------------------------------------ bad checkpoints

def _edit_config(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        cfg = json.loads((d / "config.json").read_text())
        fn(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return apply


def _edit_tensors(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        from safetensors.torch import load_file, save_file

        sd = load_file(d / "model.safetensors")
        fn(sd)
        save_file(sd, str(d / "model.safetensors"))
    return apply


def _ids(ids: list[int]) -> Callable[[Path], None]:
    return _edit_config(lambda c: c["dflash_config"].__setitem__("target_layer_ids", ids))


def _truncate(d: Path) -> None:
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])


def _set(key: str, value) -> Callable[[Path], None]:
    return _edit_config(lambda c: c.__setitem__(key, value))


def _set_dflash(key: str, value) -> Callable[[Path], None]:
    return _edit_config(lambda c: c["dflash_config"].__setitem__(key, value))


BAD_CASES = {
    "malformed_json": (lambda d: (d / "config.json").write_text("{not json"), "config_malformed", "is not valid JSON"),
    "missing_key": (_edit_config(lambda c: c.pop("model_type")), "sglang_refuses",
                    "Should have a `model_type` key in its config.json"),
    "hidden_size": (_set("hidden_size", 32), "hidden_size_mismatch", "hidden_size 32 != target hidden_size 64"),
    "layer_out_of_range": (_ids([1, 9]), "sglang_refuses", "DFLASH target_layer_ids contains an out-of-range layer "
                           "id. target_layer_ids[1]=9, target_num_layers=6."),
    "layer_is_last": (_ids([1, 5]), "layer_id_is_last", "target_layer_ids contains 5, the target's last layer"),
    "layer_duplicate": (_ids([3, 3]), "layer_ids_duplicate", "target_layer_ids has duplicates: [3, 3]"),
    "layer_unsorted": (_ids([3, 1]), "layer_ids_unsorted", "target_layer_ids must be increasing, got [3, 1]"),
    "block_size": (_set_dflash("block_size", 1), "block_size_too_small", "block_size must be an int >= 2, got 1"),
    "mask_out_of_vocab": (_set_dflash("mask_token_id", 4096), "sglang_refuses",
                          "DFLASH mask_token_id is outside the target vocab size. mask_token_id=4096, "
                          "vocab_size=1024."),
    "mask_mismatch": (_set_dflash("mask_token_id", 3), "sglang_refuses",
                      "DFLASH config mismatch: dflash_config.mask_token_id conflicts with tokenizer vocab id for "
                      "dflash_config.mask_token. mask_token='<|reserved_special_token_0|>', mask_token_id=3, "
                      "tokenizer_vocab_id=4."),
    "missing_tensor": (_edit_tensors(lambda sd: sd.pop("norm.weight")), "tensor_missing",
                       "missing tensor norm.weight [64]"),
    "extra_tensor": (_edit_tensors(lambda sd: sd.__setitem__("embed_tokens.weight", sd["fc.weight"].clone())),
                     "tensor_extra", "extra tensor embed_tokens.weight [64, 128] (SGLang would silently ignore it)"),
    "wrong_shape": (_edit_tensors(lambda sd: sd.__setitem__("fc.weight", sd["fc.weight"][:, :64].contiguous())),
                    "tensor_shape", "tensor fc.weight has shape [64, 64], expected [64, 128]"),
    "wrong_dtype": (_edit_tensors(lambda sd: sd.__setitem__("norm.weight", sd["norm.weight"].int())),
                    "tensor_dtype", "tensor norm.weight has dtype I32, expected one of BF16, F16, F32"),
    "truncated": (_truncate, "weights_unreadable", "(truncated file?)"),
}


@pytest.fixture
def bad_copy(drafter: Path, tmp_path: Path) -> Callable[[str], Path]:
    def make(case: str) -> Path:
        d = tmp_path / case
        shutil.copytree(drafter, d)
        BAD_CASES[case][0](d)
        return d
    return make


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_check_reports_specific_problem(case: str, target: Path, bad_copy: Callable[[str], Path]) -> None:
    d = bad_copy(case)
    _, code, text = BAD_CASES[case]
    problems = check_drafter(d, target)
    assert any(p.code == code and text in p.message for p in problems), [str(p) for p in problems]
    with pytest.raises(DrafterCheckError) as err:
        assert_drafter_ok(d, target)
    assert text in str(err.value)


@pytest.mark.parametrize("case", ["malformed_json", "hidden_size", "layer_is_last", "extra_tensor", "wrong_shape"])
def test_cli_check_exits_2_with_problem_line(case: str, target: Path, bad_copy: Callable[[str], Path]) -> None:
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    res = CliRunner().invoke(app, ["drafter", "check", str(bad_copy(case)), "--target", str(target)])
    assert res.exit_code == 2
    assert any(line.startswith("error: ") and BAD_CASES[case][2] in line for line in res.stderr.splitlines())
    assert all(line.startswith("error: ") for line in res.stderr.splitlines()) and res.stdout == ""
    assert "Traceback" not in res.output
    assert isinstance(res.exception, SystemExit)  # typer.Exit(2), not an uncaught error


def test_check_accepts_what_sglang_accepts(target: Path, drafter: Path, tmp_path: Path) -> None:
    """Keys SGLang defaults or resolves from the target are not problems: a mask_token_id found in the tokenizer,
    a vocab_size other than the target's (a plain DFlash drafter owns no vocabulary-sized tensor), F16 tensors in
    a float32 drafter (SGLang casts on load), a num_target_layers other than the target's (SGLang warns and uses
    the target's)."""
    d = tmp_path / "lenient"
    shutil.copytree(drafter, d)
    _edit_config(lambda c: (c["dflash_config"].pop("mask_token_id"), c.__setitem__("vocab_size", 2048),
                            c.__setitem__("num_target_layers", 8)))(d)
    _edit_tensors(lambda sd: sd.__setitem__("norm.weight", sd["norm.weight"].half()))(d)
    report = check_drafter_report(d, target)
    assert report.problems == []
    assert (report.spec.mask_token_id, report.spec.num_target_layers, report.spec.vocab_size) == (4, 6, 2048)
    assert report.used["mask_token_id"] == "4 (the target tokenizer's id)"
    assert report.notes == ("Draft config num_target_layers=8 differs from runtime target num_hidden_layers=6; "
                            "selecting capture layers based on the runtime target model.",)


def test_cli_check_missing_drafter_says_error(target: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    res = CliRunner().invoke(app, ["drafter", "check", str(tmp_path / "none"), "--target", str(target)])
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: drafter path does not exist: {tmp_path / 'none'}" and res.stdout == ""


def test_check_missing_target_and_drafter(drafter: Path, tmp_path: Path) -> None:
    assert Problem("target_missing", f"target path does not exist: {tmp_path / 'nope'}") in check_drafter(
        drafter, tmp_path / "nope")
    assert check_drafter(tmp_path / "none", tmp_path) == [
        Problem("drafter_missing", f"drafter path does not exist: {tmp_path / 'none'}")]
    res = subprocess.run(
        [sys.executable, "-c", "from sglang_specopd.app.cli.entry import main; main()", "drafter", "check", str(drafter),
         "--target", str(tmp_path / "nope")],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: target path does not exist: {tmp_path / 'nope'}"
    assert "Traceback" not in res.stderr + res.stdout


def test_cli_init_and_check_ok(target: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    runner = CliRunner()
    out = tmp_path / "cli"
    res = runner.invoke(app, ["drafter", "init", "--target", str(target), "--block-size", "4", "--num-layers", "1",
                              "--out", str(out), "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == str(out)
    res = runner.invoke(app, ["drafter", "check", str(out), "--target", str(target)])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(f"ok: {out}: 1 layers x hidden 64") and "target_layer_ids [3] of 6" in res.stdout


# ----------------------------------------------------------------------------------- SGLang's own parser and loader

_SGLANG_SCRIPT = r"""
import json, os, sys
import torch
from safetensors.torch import load_file
from sglang.srt.runtime_context import get_parallel
from sglang.srt.speculative.dflash_utils import build_target_layer_ids, parse_dflash_draft_config
from sglang.srt.utils.hf_transformers.config import get_config
d = sys.argv[1]
cfg = get_config(d, trust_remote_code=False)  # SGLang's HF config parser (AutoConfig)
p = parse_dflash_draft_config(draft_hf_config=cfg)
out = {"block_size": p.block_size, "target_layer_ids": p.target_layer_ids, "mask_token": p.mask_token,
       "mask_token_id": p.mask_token_id, "num_hidden_layers": p.num_hidden_layers,
       "num_target_layers": p.num_target_layers,
       "sglang_ids": {f"{n},{k}": build_target_layer_ids(n, k)
                      for n, k in [(30, 1), (30, 2), (30, 3), (36, 5), (32, 4), (8, 3)]}}
from sglang.srt.models.dflash import DFlashDraftModel
with get_parallel().override(tp_size=1, tp_rank=0):
    m = DFlashDraftModel(cfg)
    for prm in m.parameters():
        prm.data.fill_(float("nan"))
    sd = load_file(os.path.join(d, "model.safetensors"))
    m.load_weights(sd.items())
    out["unloaded"] = sorted(n for n, prm in m.named_parameters() if torch.isnan(prm).any())
    qkv = m.layers[1].self_attn.qkv_proj.weight
    ref = torch.cat([sd[f"layers.1.self_attn.{x}_proj.weight"] for x in "qkv"])
    out["qkv_equal"] = bool(torch.equal(qkv, ref))
    out["attn_type"] = str(m.layers[0].self_attn.attn.attn_type)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_sglang_parses_and_loads_drafter(drafter: Path) -> None:
    """SGLang's parse_dflash_draft_config accepts our config; DFlashDraftModel (CPU) loads every parameter."""
    from sglang_specopd.server.cpu import STANDIN_DIR

    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": f"{STANDIN_DIR}{os.pathsep}{REPO}"}
    res = subprocess.run([sys.executable, "-c", _SGLANG_SCRIPT, str(drafter)], capture_output=True, text=True,
                         env=env, timeout=600)
    lines = [line for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert (got["block_size"], got["target_layer_ids"], got["mask_token"], got["mask_token_id"]) == (
        8, [1, 3], "<|reserved_special_token_0|>", 4)
    assert (got["num_hidden_layers"], got["num_target_layers"]) == (2, 6)
    for key, ids in got["sglang_ids"].items():
        n, layers = map(int, key.split(","))
        assert default_target_layer_ids(n, layers) == ids
    assert got["unloaded"] == [] and got["qkv_equal"] is True
    assert got["attn_type"] == "AttentionType.ENCODER_ONLY"  # non-causal inside the block


# ---------------------------------------------------------------------------------------------- the real target

SMOL_DIR = Path(os.environ.get("SPECOPD_HOME", Path.home() / ".cache" / "specopd")) / "models" / "SmolLM2-135M-Instruct"


@pytest.mark.smollm2
@pytest.mark.skipif(not (SMOL_DIR / ".specopd-prepared.json").is_file(), reason="SmolLM2 not prepared")
def test_smollm2_drafter(tmp_path: Path) -> None:
    spec = init_drafter(SMOL_DIR, tmp_path / "d", block_size=8, num_layers=2)
    assert (spec.mask_token, spec.mask_token_id) == ("<empty_output>", 16)
    assert spec.target_layer_ids == (1, 27) and spec.num_target_layers == 30
    assert (spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim) == (576, 9, 3, 64)
    assert check_drafter(tmp_path / "d", SMOL_DIR) == []
