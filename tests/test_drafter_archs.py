"""Tests of the drafter-architecture registry (sglang_specopd.wire.drafters.archs) and of everything that reads it:
the trainer's drafter registry, drafter init/check (library and ``specopd drafter`` CLI) and the hot-swap checks.

A dummy architecture registered here (never in the modules themselves) must be usable by all of them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from fakes.drafter_arch import DUMMY, DummySpec
from fakes.drafter_arch import dummy_config as _dummy_config
from sglang_specopd.app.drafters.check import Problem, check_drafter, describe
from sglang_specopd.wire.checkpoint_info import read_safetensors_header
from sglang_specopd.wire.drafters.archs import (
    DFLASH,
    DrafterArch,
    UnknownDrafterArchError,
    arch_for_architecture,
    arch_for_config,
    arch_for_spec,
    drafter_arch_names,
    get_drafter_arch,
    load_drafter_spec,
    parse_drafter_config,
    register_drafter_arch,
    spec_as_dict,
    unregister_drafter_arch,
)
from sglang_specopd.wire.drafters.format import DrafterConfigError, DrafterSpec, drafter_config, expected_tensors
from sglang_specopd.wire.drafters.init import DrafterInitError, init_drafter, init_drafter_tensors

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent



@pytest.fixture
def dummy_arch() -> Iterator[DrafterArch]:
    """DUMMY registered for one test (and the trainer class a test may add for it removed afterwards)."""
    from specopd_trainer.drafters.registry import DRAFTERS

    register_drafter_arch(DUMMY)
    try:
        yield DUMMY
    finally:
        DRAFTERS.pop("dummy", None)
        unregister_drafter_arch("dummy")


@pytest.fixture(scope="module")
def target(tiny_target6: Path) -> Path:
    return tiny_target6


@pytest.fixture(scope="module")
def dflash_dir(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("drf") / "dflash"
    init_drafter(target, out, block_size=4, num_layers=2, seed=0)
    return out


def _spec(**kw: Any) -> DrafterSpec:
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=128, rms_norm_eps=1e-5, rope_theta=10000.0, vocab_size=1024,
                max_position_embeddings=2048, block_size=8, target_layer_ids=(1, 3), mask_token="<m>",
                mask_token_id=4, num_target_layers=6)
    return DrafterSpec(**{**base, **kw})


# ------------------------------------------------------------------------------------------------------- DFlash

def test_dflash_entry() -> None:
    arch = get_drafter_arch("dflash")
    assert arch is DFLASH and drafter_arch_names() == ["dflash", "dflash2", "dspark"]
    assert (arch.name, arch.architecture, arch.speculative_algorithm, arch.sglang_worker) == (
        "dflash", "DFlashDraftModel", "DFLASH", "DFlashWorkerV2")
    assert arch.spec_type is DrafterSpec and arch.label == "'DFlashDraftModel' (dflash)"
    assert arch_for_architecture("DFlashDraftModel") is arch
    assert arch_for_config({"architectures": ["DFlashDraftModel"]}) is arch
    assert arch_for_spec(_spec()) is arch
    assert register_drafter_arch(DFLASH) is DFLASH  # an equal entry again: no-op
    assert drafter_arch_names() == ["dflash", "dflash2", "dspark"]


def test_dflash_round_trips_through_the_registry() -> None:
    spec = _spec(dtype="bfloat16")
    cfg = json.loads(json.dumps(DFLASH.config(spec)))
    assert cfg == drafter_config(spec) and cfg["architectures"] == ["DFlashDraftModel"]
    assert parse_drafter_config(cfg) == spec and parse_drafter_config(cfg, "dflash") == spec
    assert DFLASH.parse_config(cfg) == spec
    assert DFLASH.expected_tensors(spec) == expected_tensors(spec)
    assert list(init_drafter_tensors(spec)) == list(expected_tensors(spec))
    d = spec_as_dict(spec)
    assert d["target_layer_ids"] == [1, 3] and d["dtype"] == "bfloat16" and d["block_size"] == 8
    assert json.loads(json.dumps(d)) == d


def test_init_writes_what_the_entry_expects(target: Path, dflash_dir: Path) -> None:
    spec = load_drafter_spec(dflash_dir)
    assert spec == load_drafter_spec(dflash_dir, "dflash")
    assert isinstance(spec, DrafterSpec) and (spec.block_size, spec.target_layer_ids) == (4, (1, 3))
    header = read_safetensors_header(dflash_dir / "model.safetensors")
    assert {n: shape for n, (_, shape) in header.items()} == DFLASH.expected_tensors(spec)
    assert {tag for tag, _ in header.values()} == {"F32"}
    assert json.loads((dflash_dir / "config.json").read_text()) == DFLASH.config(spec)
    assert describe(spec) == ("2 layers x hidden 64 (4/2 heads), block_size 4, target_layer_ids [1, 3] of 6, mask "
                              "'<|reserved_special_token_0|>' (id 4), float32, 0.08M params")
    assert check_drafter(dflash_dir, target, "dflash") == []


# ------------------------------------------------------------------------------------------------ unknown archs

def test_unknown_architecture_errors(tmp_path: Path, target: Path, dflash_dir: Path) -> None:
    from specopd_trainer.drafters import UnknownDrafterError, get_drafter_class, register_drafter

    with pytest.raises(UnknownDrafterArchError) as err:
        get_drafter_arch("eagle3")
    assert str(err.value) == ("unknown drafter architecture 'eagle3'; registered: "
                              "'DFlashDraftModel' (dflash), 'DFlash2DraftModel' (dflash2), 'DSparkDraftModel' (dspark)")
    assert isinstance(err.value, KeyError) and err.value.known == ["dflash", "dflash2", "dspark"]
    with pytest.raises(UnknownDrafterArchError, match=r"architectures \['LlamaForCausalLM'\] is not a registered "
                                                      r"drafter architecture; registered: 'DFlashDraftModel'"):
        arch_for_config({"architectures": ["LlamaForCausalLM"]})
    with pytest.raises(UnknownDrafterArchError, match="architectures None is not a registered"):
        arch_for_config({})
    with pytest.raises(UnknownDrafterArchError, match="architectures \\['DFlashDraftModel', 'X'\\]"):
        arch_for_config({"architectures": ["DFlashDraftModel", "X"]})
    with pytest.raises(UnknownDrafterArchError, match="'LlamaForCausalLMEagle3' is not a registered"):
        arch_for_architecture("LlamaForCausalLMEagle3")
    with pytest.raises(UnknownDrafterArchError, match="no registered drafter architecture has spec type dict"):
        arch_for_spec({})
    llama = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64}
    with pytest.raises(DrafterConfigError) as cerr:
        parse_drafter_config(llama)
    assert [c for c, _ in cerr.value.problems] == ["config_invalid"]
    with pytest.raises(DrafterConfigError) as cerr:  # the expected arch's own parser lists every problem
        parse_drafter_config(llama, "dflash")
    assert cerr.value.problems[0] == ("config_invalid", "architectures must be ['DFlashDraftModel'], got "
                                                        "['LlamaForCausalLM']")
    assert ("config_key_missing", "config.json is missing key dflash_config (an object)") in cerr.value.problems
    with pytest.raises(DrafterConfigError, match="must hold a JSON object, got list"):
        parse_drafter_config([1])
    with pytest.raises(UnknownDrafterArchError, match="'eagle3'"):
        load_drafter_spec(dflash_dir, "eagle3")
    with pytest.raises(UnknownDrafterArchError, match="'eagle3'"):
        check_drafter(dflash_dir, target, "eagle3")
    with pytest.raises(UnknownDrafterArchError, match="'eagle3'"):
        init_drafter(target, tmp_path / "d", arch="eagle3")
    assert not (tmp_path / "d").exists()
    with pytest.raises(UnknownDrafterError, match="unknown drafter 'eagle3'; registered drafters: dflash, dflash2, "
                                                  "dspark"):
        get_drafter_class("eagle3")
    with pytest.raises(UnknownDrafterError, match="unknown drafter architecture 'eagle3'"):
        register_drafter("eagle3")
    assert issubclass(UnknownDrafterError, UnknownDrafterArchError)


def test_register_refuses_conflicts() -> None:
    with pytest.raises(ValueError, match="'DFlashDraftModel' \\(dflash\\) already has that name"):
        register_drafter_arch(DrafterArch(**{**DUMMY.__dict__, "name": "dflash"}))
    with pytest.raises(ValueError, match="already has that name, architecture or spec type"):
        register_drafter_arch(DrafterArch(**{**DUMMY.__dict__, "architecture": "DFlashDraftModel"}))
    with pytest.raises(ValueError, match="already has that name, architecture or spec type"):
        register_drafter_arch(DrafterArch(**{**DUMMY.__dict__, "spec_type": DrafterSpec}))
    with pytest.raises(ValueError, match="spec_type must be a dataclass with a dtype field"):
        register_drafter_arch(DrafterArch(**{**DUMMY.__dict__, "spec_type": dict}))
    with pytest.raises(ValueError, match="non-empty name"):
        register_drafter_arch(DrafterArch(**{**DUMMY.__dict__, "name": ""}))
    assert drafter_arch_names() == ["dflash", "dflash2", "dspark"]


# ---------------------------------------------------------------------------------- a dummy, seen everywhere

def test_dummy_arch_init_and_check(dummy_arch: DrafterArch, target: Path, dflash_dir: Path, tmp_path: Path) -> None:
    assert drafter_arch_names() == ["dflash", "dflash2", "dspark", "dummy"] and get_drafter_arch("dummy") is dummy_arch
    out = tmp_path / "dummy"
    spec = init_drafter(target, out, num_layers=3, seed=1, arch="dummy")
    assert spec == DummySpec(hidden_size=64, vocab_size=1024, num_target_layers=6, width=24)
    assert json.loads((out / "config.json").read_text()) == _dummy_config(spec)
    header = read_safetensors_header(out / "model.safetensors")
    assert {n: s for n, (_, s) in header.items()} == {"proj.weight": (24, 64), "norm.weight": (24,)}
    assert load_drafter_spec(out) == spec and load_drafter_spec(out, "dummy") == spec
    assert check_drafter(out, target) == [] and check_drafter(out, target, "dummy") == []
    assert describe(spec) == "dummy width 24, float32, 0.00M params"
    assert check_drafter(out, target, "dflash") == [Problem(
        "arch_mismatch", "config.json describes a 'DummyDraftModel' (dummy) drafter, expected a 'DFlashDraftModel' "
                         "(dflash) drafter")]
    assert check_drafter(dflash_dir, target, "dummy") == [Problem(
        "arch_mismatch", "config.json describes a 'DFlashDraftModel' (dflash) drafter, expected a 'DummyDraftModel' "
                         "(dummy) drafter")]
    cfg = json.loads((out / "config.json").read_text())
    cfg["hidden_size"] = 32  # the default target facts (top-level keys) still check the dummy against the target
    (out / "config.json").write_text(json.dumps(cfg))
    assert [(p.code, p.message) for p in check_drafter(out, target, "dummy")] == [
        ("hidden_size_mismatch", "hidden_size 32 != target hidden_size 64"),
        ("tensor_shape", "tensor proj.weight has shape [24, 64], expected [24, 32]")]
    unregister_drafter_arch("dummy")
    register_drafter_arch(DrafterArch(**{**DUMMY.__dict__, "spec_for_target": None}))  # the fixture removes it
    with pytest.raises(DrafterInitError, match="'DummyDraftModel' \\(dummy\\) cannot be created by drafter init"):
        init_drafter(target, tmp_path / "never", arch="dummy")
    assert not (tmp_path / "never").exists()


def test_dummy_arch_in_trainer_registry(dummy_arch: DrafterArch, target: Path, dflash_dir: Path,
                                        tmp_path: Path) -> None:
    from specopd_trainer.drafters import UnknownDrafterError, drafter_class_for_checkpoint, drafter_names
    from specopd_trainer.drafters import get_drafter_class, register_drafter
    from specopd_trainer.drafters.dflash import DFlashDrafter

    out = tmp_path / "dummy"
    init_drafter(target, out, arch="dummy")
    with pytest.raises(UnknownDrafterError, match="'DummyDraftModel' \\(dummy\\) has no trainable class; "
                                                  "registered drafters: dflash, dflash2, dspark"):
        get_drafter_class("dummy")
    with pytest.raises(UnknownDrafterError, match="has no trainable class"):
        drafter_class_for_checkpoint(out)

    @register_drafter("dummy")
    class DummyDrafter:
        pass

    assert get_drafter_class("dummy") is DummyDrafter and drafter_names() == ["dflash", "dflash2", "dspark", "dummy"]
    assert DummyDrafter.drafter_name == "dummy" and DummyDrafter.drafter_arch is dummy_arch
    assert drafter_class_for_checkpoint(out) is DummyDrafter
    assert drafter_class_for_checkpoint(dflash_dir) is DFlashDrafter and DFlashDrafter.drafter_arch is DFLASH
    with pytest.raises(ValueError, match="already registered to DummyDrafter"):
        register_drafter("dummy")(type("Other", (), {}))
    (out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(UnknownDrafterError, match="architectures \\['LlamaForCausalLM'\\] is not a registered"):
        drafter_class_for_checkpoint(out)


_CLI_SCRIPT = r"""
import json, sys
sys.path[:0] = [sys.argv[1]]
from sglang_specopd.wire.drafters.archs import register_drafter_arch
from fakes.drafter_arch import DUMMY
register_drafter_arch(DUMMY)  # like an extension: registered before the CLI is built
from typer.testing import CliRunner
from sglang_specopd.app.cli.entry import _register_subcommands, app
_register_subcommands()
out = []
for args in json.loads(sys.argv[2]):
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    out.append({"code": res.exit_code, "stdout": res.stdout, "stderr": res.stderr})
print("RESULT " + json.dumps(out))
"""


def test_cli_offers_registered_arches(target: Path, dflash_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "dummy"
    runs = [["drafter", "init", "--help"], ["drafter", "check", "--help"],
            ["drafter", "init", "--target", str(target), "--out", str(out), "--arch", "dummy", "--num-layers", "1"],
            ["drafter", "check", str(out), "--target", str(target), "--arch", "dummy"],
            ["drafter", "check", str(out), "--target", str(target)],
            ["drafter", "check", str(dflash_dir), "--target", str(target), "--arch", "dflash"],
            ["drafter", "init", "--target", str(target), "--out", str(tmp_path / "x"), "--arch", "eagle3"]]
    res = subprocess.run([sys.executable, "-c", _CLI_SCRIPT, str(TESTS), json.dumps(runs)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    lines = [line for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    init_help, check_help, init, check, check_default, check_dflash, bad = json.loads(lines[-1][len("RESULT "):])
    for h in (init_help, check_help):
        text = re.sub(r"\x1b\[[0-9;]*m", "", h["stdout"])
        assert h["code"] == 0 and "--arch" in text and re.search(r"dflash\|dflash2\|dspark\|dummy", text), text
    assert init["code"] == 0, init
    assert init["stdout"].strip().splitlines()[-1] == str(out)
    assert init["stderr"].strip() == "ok: dummy width 8, float32, 0.00M params"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DummyDraftModel"]
    assert check["code"] == 0 and check["stdout"].strip() == f"ok: {out}: dummy width 8, float32, 0.00M params"
    assert check_default["code"] == 2 and check_default["stdout"] == ""
    assert check_default["stderr"].strip() == ("error: config.json describes a 'DummyDraftModel' (dummy) drafter, "
                                               "expected a 'DFlashDraftModel' (dflash) drafter")
    assert check_dflash["code"] == 0 and check_dflash["stdout"].startswith(f"ok: {dflash_dir}: 2 layers x hidden 64")
    assert bad["code"] == 2 and "eagle3" in bad["stderr"] and "Traceback" not in bad["stderr"] + bad["stdout"]
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------------------- hot swap

def test_hot_swap_validation_goes_through_the_registry(dummy_arch: DrafterArch) -> None:
    import torch

    from sglang_specopd.server.drafter.swap import validate_swap

    dflash_spec, dummy_spec = _spec(), DummySpec(64, 1024, 6, width=8)
    dflash_tensors = init_drafter_tensors(dflash_spec, 0)
    dummy_tensors = init_drafter_tensors(dummy_spec, 0)
    assert {n: tuple(t.shape) for n, t in dummy_tensors.items()} == {"proj.weight": (8, 64), "norm.weight": (8,)}
    validate_swap(dflash_spec, drafter_config(dflash_spec), dflash_tensors)  # drop-ins pass
    validate_swap(dummy_spec, _dummy_config(dummy_spec), dummy_tensors)
    with pytest.raises(ValueError) as err:
        validate_swap(dflash_spec, _dummy_config(dummy_spec), dummy_tensors)
    assert str(err.value) == ("refused: config.architectures is ['DummyDraftModel'], a dummy drafter, but a dflash "
                              "drafter (['DFlashDraftModel']) is serving; a swap cannot change the drafter "
                              "architecture (restart the server with the new drafter)")
    with pytest.raises(ValueError, match="a dflash drafter, but a dummy drafter \\(\\['DummyDraftModel'\\]\\) is "
                                         "serving; a swap cannot change the drafter architecture"):
        validate_swap(dummy_spec, drafter_config(dflash_spec), dflash_tensors)
    with pytest.raises(ValueError, match="refused: config.architectures is \\['LlamaForCausalLM'\\], not "
                                         "\\['DFlashDraftModel'\\] of the serving dflash drafter \\(is this a target"):
        validate_swap(dflash_spec, {"architectures": ["LlamaForCausalLM"]}, dflash_tensors)
    with pytest.raises(ValueError, match="refused: the new drafter differs from the serving one in width"):
        validate_swap(dummy_spec, _dummy_config(DummySpec(64, 1024, 6, width=16)), dummy_tensors)
    bad = {**dummy_tensors, "proj.weight": torch.zeros(8, 65)}
    with pytest.raises(ValueError, match="refused: proj.weight has shape \\(8, 65\\), expected \\(8, 64\\)"):
        validate_swap(dummy_spec, _dummy_config(dummy_spec), bad)
    with pytest.raises(ValueError, match="missing \\['norm.weight'\\]"):
        validate_swap(dummy_spec, _dummy_config(dummy_spec), {"proj.weight": dummy_tensors["proj.weight"]})


def test_target_info_of_a_mixture_of_experts_config(tmp_path: Path) -> None:
    """A MoE target config has no ``intermediate_size``: the drafter's MLP width is the shared expert's (Qwen3-Next,
    Qwen4-Exp), else one routed expert's; with neither the config is refused naming the field."""
    from sglang_specopd.wire.checkpoint_info import TargetConfigError, read_target_info

    base = {"hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4, "vocab_size": 100,
            "moe_intermediate_size": 96}
    for extra, want in (({"shared_expert_intermediate_size": 128}, 128), ({}, 96)):
        (tmp_path / "config.json").write_text(json.dumps({"text_config": {**base, **extra}}))
        assert read_target_info(tmp_path).intermediate_size == want
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in base.items() if k != "moe_intermediate_size"}))
    with pytest.raises(TargetConfigError, match="intermediate_size"):
        read_target_info(tmp_path)
