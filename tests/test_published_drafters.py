"""Drafters in every published layout load here exactly when SGLang 0.5.23 loads them (issue 40, part 1).

Layouts (``tests/_published_layouts.py``, re-typed from public configs, dims shrunk): the DFlash authors'
releases, SpecForge exports (DFlash, DFlash V2, DSpark), a vLLM speculators export, plus edits SGLang refuses.
SGLang's own code reads every one of them in a subprocess (``tests/_sglang_draft_configs.py``: its config loader,
parsers, model classes with ``load_weights``, the worker's block-size and mask-token resolution), and
``specopd drafter check`` must agree: accepted with the same block size, context layer ids, mask token and id,
attention windows and heads, or refused with SGLang's own message. A z-lab-layout drafter is pushed with
``specopd drafter push`` into the shared tiny SPECOPD server (conftest's ``tiny_admin_server``) and served.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _published_layouts import EXPECTED, HIDDEN, LAYOUTS, TOKENIZER_LEN, VOCAB, layout
from sglang_specopd.app.drafters.check import check_drafter_report
from sglang_specopd.wire.drafters.archs import load_drafter_spec, resolve_drafter_config
from sglang_specopd.wire.drafters.format import DrafterConfigError
from sglang_specopd.wire.drafters.sglang_dflash import QWEN3_DEFAULTS

REPO = Path(__file__).resolve().parents[1]


def _edit(name: str, fn) -> dict:
    cfg = layout(name)
    fn(cfg)
    return cfg


# Edits of the published layouts: each is refused by SGLang for one reason (or accepted: the DSpark export with
# its Markov keys also at the top level, where DSparkDraftModel reads them).
VARIANTS = {
    "zlab_mask_conflict": _edit("zlab_qwen3", lambda c: c["dflash_config"].update(mask_token="<|im_end|>")),
    "zlab_layer_out_of_range": _edit("zlab_qwen3", lambda c: c["dflash_config"].update(target_layer_ids=[1, 6])),
    "zlab_mask_outside_vocab": _edit("zlab_qwen3", lambda c: c["dflash_config"].update(mask_token_id=VOCAB)),
    "specforge_dflash2_no_window": _edit("specforge_dflash2", lambda c: c.update(use_sliding_window=False)),
    "specforge_dflash2_bad_group": _edit("specforge_dflash2", lambda c: c["dflash_config"].update(conv_group_size=5)),
    "specforge_dflash2_no_selector": _edit("specforge_dflash2", lambda c: c["dflash_config"].update(
        selector_rank=0, selector_top_k=0)),
    "specforge_dspark_top_level": _edit("specforge_dspark", lambda c: c.update(markov_rank=8,
                                                                               markov_head_type="gated")),
    "specforge_dspark_no_mask_id": _edit("specforge_dspark", lambda c: (
        c.update(markov_rank=8, markov_head_type="vanilla"), c["dflash_config"].pop("mask_token_id"))),
}
CASES = {**LAYOUTS, **VARIANTS}


@pytest.fixture(scope="module")
def qwen_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 target: 6 layers, hidden 64, a 1,024-token tokenizer in a 1,088-row vocabulary (so SGLang can
    add a ``<|MASK|>`` token, as on Qwen3)."""
    from _tiny_target import make_tiny_target

    return make_tiny_target(tmp_path_factory.mktemp("qwen") / "qwen3", arch="qwen3", num_layers=6, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def drafters(qwen_target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every case written as a drafter directory; weights (random, the tensors our resolution expects) for the
    configs specopd accepts, none for the others (SGLang refuses those before loading weights)."""
    from safetensors.torch import save_file

    from sglang_specopd.wire.drafters.init import init_drafter_tensors
    from sglang_specopd.wire.drafters.layouts import target_facts

    root, facts = tmp_path_factory.mktemp("published"), target_facts(str(qwen_target))
    out = {}
    for name, cfg in CASES.items():
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg, indent=2))
        try:
            spec = resolve_drafter_config(cfg, None, facts, str(d))[0]
        except DrafterConfigError:
            spec = None
        if spec is not None:
            save_file(init_drafter_tensors(spec, 0), str(d / "model.safetensors"))
        out[name] = d
    return out


@pytest.fixture(scope="module")
def sglang_reads(qwen_target: Path, drafters: dict[str, Path]) -> dict[str, dict]:
    """SGLang's own reading of every case (one subprocess, ~15 s): name -> ``{"ok": ..., values | error}``."""
    from sglang_specopd.server.cpu import STANDIN_DIR

    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1",
           "SGLANG_RAGGED_VERIFY_MODE": "cap-accept", "PYTHONPATH": f"{STANDIN_DIR}{os.pathsep}{REPO}"}
    res = subprocess.run([sys.executable, str(REPO / "tests" / "_sglang_draft_configs.py"), str(qwen_target),
                          *(str(d) for d in drafters.values())], capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT "):])
    return {name: got[str(d)] for name, d in drafters.items()}


@pytest.mark.slow
def test_every_layout_agrees_with_sglang(qwen_target: Path, drafters: dict[str, Path],
                                        sglang_reads: dict[str, dict]) -> None:
    accepted = []
    for name, d in drafters.items():
        theirs, report = sglang_reads[name], check_drafter_report(d, qwen_target)
        if not theirs["ok"]:
            assert [(p.code, p.message) for p in report.problems] == [("sglang_refuses", theirs["error"])], name
            continue
        accepted.append(name)
        assert report.problems == [], (name, report.problems)
        spec = report.spec
        block = spec.gamma if hasattr(spec, "gamma") else spec.block_size
        assert (block, list(spec.target_layer_ids), spec.mask_token, spec.mask_token_id) == (
            theirs["block_size"], theirs["target_layer_ids"], theirs["mask_token"], theirs["mask_token_id"]), name
        assert spec.num_hidden_layers == theirs["num_hidden_layers"], name
        assert theirs["fc_in"] == len(spec.target_layer_ids) * HIDDEN and theirs["unloaded"] == [], name
        assert [getattr(spec, "conv_kernel_size", 0), getattr(spec, "conv_group_size", 0)] == theirs["conv"], name
        assert [getattr(spec, "selector_rank", 0), getattr(spec, "selector_top_k", 0)] == theirs["selector"], name
        if "markov" in theirs:  # DSpark: the Markov head SGLang built
            kind = {"VanillaMarkov": "vanilla", "GatedMarkovHead": "gated", "RNNHead": "rnn"}[theirs["markov"][0]]
            assert [spec.markov_head_type, spec.markov_rank] == [kind, theirs["markov"][1]], name
        if "attention" in theirs:  # SGLang keeps window_left = HF window - 1; ENCODER_ONLY = non-causal
            window = [-1 if t == "full_attention" else spec.sliding_window - 1
                      for t in (spec.layer_types or ("full_attention",) * spec.num_hidden_layers)]
            assert [w for w, _ in theirs["attention"]] == window, name
            assert all(kind.endswith("ENCODER_ONLY") for _, kind in theirs["attention"]) == (spec.is_causal is not True)
    assert sorted(accepted) == sorted(["zlab_qwen3", "zlab_qwen35", "specforge_dflash", "specforge_dflash2",
                                       "specforge_dspark_top_level"])
    for name, want in EXPECTED.items():  # the table in _published_layouts.py says what SGLang does, too
        theirs = sglang_reads[name]
        got = (theirs["block_size"], theirs["target_layer_ids"], theirs["mask_token"], theirs["mask_token_id"]) \
            if theirs["ok"] else None
        assert got == want, name


def test_qwen3_defaults_are_transformers() -> None:
    """A key a published config leaves out takes transformers' Qwen3Config default in SGLang (e.g. head_dim 128,
    not hidden / heads): the mirror's table is that class's."""
    from transformers import Qwen3Config

    c = Qwen3Config()
    for key, value in QWEN3_DEFAULTS.items():
        got = c.rope_parameters["rope_theta"] if key == "rope_theta" else getattr(c, key)
        if key == "sliding_window":  # Qwen3Config drops it unless use_sliding_window
            got = Qwen3Config(use_sliding_window=True).sliding_window
        assert got == value, key


def test_without_target_only_what_needs_it_is_deferred(drafters: dict[str, Path]) -> None:
    """The hot-swap and trainer paths parse configs without the target: a z-lab layout resolves completely
    (``num_target_layers`` and ``mask_token_id`` are in it); layouts that leave those to the target say so."""
    spec = load_drafter_spec(drafters["zlab_qwen3"])
    assert (spec.block_size, spec.target_layer_ids, spec.mask_token_id, spec.num_target_layers) == (
        16, (1, 3), TOKENIZER_LEN, 6)
    assert spec.rope_theta == 1000000 and spec.dtype == "bfloat16" and spec.plain_attention
    for name, what in (("zlab_qwen35", "num_target_layers"), ("specforge_dflash", "dflash_config.mask_token_id")):
        with pytest.raises(DrafterConfigError) as err:
            load_drafter_spec(drafters[name])
        assert err.value.problems[0][0] == "needs_target" and f"config.json has no {what}" in str(err.value)


def test_cli_check_prints_what_sglang_uses(qwen_target: Path, drafters: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    res = CliRunner().invoke(app, ["drafter", "check", str(drafters["specforge_dflash"]), "--target",
                                   str(qwen_target)])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[1:] == [
        "sglang: block_size 16 (top-level block_size)",
        "sglang: target_layer_ids [1, 3] (SGLang built for a 6-layer target)",
        "sglang: mask_token '<|MASK|>' (SGLang default)",
        f"sglang: mask_token_id {TOKENIZER_LEN} (added to the target tokenizer by SGLang)"]
    res = CliRunner().invoke(app, ["drafter", "check", str(drafters["specforge_dspark"]), "--target",
                                   str(qwen_target), "--arch", "dspark"])
    assert res.exit_code == 2 and res.stderr.strip() == (
        "error: DSpark requires markov_rank > 0 (the Markov head is the core of the semi-AR draft); got "
        "markov_rank=0.")


def test_trainer_refuses_what_it_cannot_train(drafters: dict[str, Path]) -> None:
    """SGLang serves sliding-window / causal draft layers (and specopd checks and pushes them); specopd's trainer
    implements DFlash's non-causal full attention only and says so."""
    from specopd_trainer.drafters import get_drafter_class
    from specopd_trainer.drafters.dflash import DrafterLoadError

    spec = load_drafter_spec(drafters["specforge_dflash2"])
    assert spec.layer_types == ("sliding_attention",) * 2 and spec.sliding_window == 32 and spec.is_causal is False
    with pytest.raises(DrafterLoadError, match="specopd trains DFlash's non-causal full attention only"):
        get_drafter_class("dflash2")(spec)


def test_unsupported_variants_are_named(qwen_target: Path, tmp_path: Path) -> None:
    """What SGLang serves but specopd's drafter does not implement is refused with its name, not a crash."""
    for edit, what in ((lambda c: c["dflash_config"].update(projector_type="domino"), "Domino projector"),
                       (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
                        "scaled or partial RoPE"),
                       (lambda c: c.update(quantization_config={"quant_method": "fp8"}), "quantized drafter")):
        with pytest.raises(DrafterConfigError) as err:
            resolve_drafter_config(_edit("zlab_qwen3", edit))
        assert err.value.problems[0][0] == "unsupported_by_specopd" and what in str(err.value)


# ------------------------------------------------------------------------------------- pushed and served live

def test_zlab_layout_pushed_and_served(tiny_admin_server, tiny_drafter: Path, tmp_path: Path) -> None:
    """``specopd drafter push`` of the tiny server's own drafter re-written in the z-lab layout (top-level
    block_size, no mask_token, a float32 checkpoint labelled bfloat16): the server swaps it in, and it serves
    (greedy output unchanged, verify steps proposed by the pushed version). A block size other than the serving
    one is refused by the server; a speculators export is refused before anything is sent."""
    from typer.testing import CliRunner

    from conftest import TINY_ADMIN_KEY, TINY_PROMPTS
    from sglang_specopd.app.cli.entry import _register_subcommands, app

    srv = tiny_admin_server
    spec = load_drafter_spec(tiny_drafter)
    cfg = layout("zlab_qwen3")
    cfg.update(hidden_size=spec.hidden_size, num_hidden_layers=spec.num_hidden_layers, vocab_size=spec.vocab_size,
               num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
               head_dim=spec.head_dim, intermediate_size=spec.intermediate_size, rms_norm_eps=spec.rms_norm_eps,
               rope_theta=spec.rope_theta, max_position_embeddings=spec.max_position_embeddings,
               block_size=spec.block_size, num_target_layers=spec.num_target_layers,
               layer_types=["full_attention"] * spec.num_hidden_layers, max_window_layers=spec.num_hidden_layers,
               dflash_config={"mask_token_id": spec.mask_token_id, "target_layer_ids": list(spec.target_layer_ids)})
    d = tmp_path / "zlab-layout"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    shutil.copy(tiny_drafter / "model.safetensors", d / "model.safetensors")
    before = [srv.generate(p, 24)["output_ids"] for p in TINY_PROMPTS]
    _register_subcommands()
    run = CliRunner().invoke
    res = run(app, ["drafter", "push", str(d), "--server", srv.url, "--admin-key", TINY_ADMIN_KEY])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(f"pushed {d} (25 tensors): serving version 'zlab-layout'"), res.stdout
    for prompt, want in zip(TINY_PROMPTS, before):
        out = srv.generate(prompt, 24)
        assert out["output_ids"] == want
        assert out["meta_info"]["spec_verify_ct"] > 0
        assert set(out["meta_info"]["specopd_drafter_versions"]) == {"zlab-layout"}
    cfg["block_size"] = spec.block_size * 2
    (d / "config.json").write_text(json.dumps(cfg))
    res = run(app, ["drafter", "push", str(d), "--server", srv.url, "--admin-key", TINY_ADMIN_KEY, "--version", "x"])
    assert res.exit_code == 2 and "the server refused the drafter: HTTP 400: refused: the new drafter differs from " \
                                  "the serving one in block_size" in res.stderr, res.output
    spec_dir = tmp_path / "speculators"
    spec_dir.mkdir()
    (spec_dir / "config.json").write_text(json.dumps(LAYOUTS["speculators_dflash"]))
    res = run(app, ["drafter", "push", str(spec_dir), "--server", "http://127.0.0.1:9", "--admin-key", "k"])
    assert res.exit_code == 2 and res.stderr.strip() == (
        f"error: Unrecognized model in {spec_dir}. Should have a `model_type` key in its config.json.")


def test_specopd_serve_validates_published_layouts(qwen_target: Path, drafters: dict[str, Path]) -> None:
    """``specopd serve``'s own validation (``launch_spec``, as before every real launch) takes a SpecForge export
    (no dflash_config: block size, layers and mask token all SGLang's defaults) for the tiny Qwen3 target and builds
    its launch; the refused DSpark export fails with SGLang's reason before anything starts."""
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import free_port
    from sglang_specopd.app.serve.choice import DrafterInvalidError
    from sglang_specopd.app.serve.spec import launch_spec

    cfg = ServeConfig(name="tiny-published", target=str(qwen_target), drafter=str(drafters["specforge_dflash"]),
                      block_size=16, device="cpu", dtype="float32", attention_backend="torch_native")
    argv = launch_spec(cfg, port=free_port()).argv()
    assert argv[argv.index("--speculative-algorithm") + 1] == "SPECOPD"
    assert argv[argv.index("--served-model-name") + 1] == "qwen3"
    with pytest.raises(DrafterInvalidError, match=r"DSpark requires markov_rank > 0 \(the Markov head"):
        launch_spec(cfg.model_copy(update={"drafter": str(drafters["specforge_dspark"]), "block_size": 17}),
                    port=free_port())
