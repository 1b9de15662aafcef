"""Tests of the DFlash V2 (``dflash2``) and DSpark (``dspark``) drafters: SGLang 0.5.23 checkpoint formats, fresh
init, conditional log-probs against brute-force enumeration, parity with SGLang's own model classes, and
``specopd drafter init|check``.

Tiny dims throughout (hidden 32, vocabulary 11, verify block 4 = 3 drafted slots: all 11^3 branches enumerable).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_specopd.app.drafters.check import check_drafter
from sglang_specopd.wire.drafters.archs import parse_drafter_config
from sglang_specopd.wire.drafters.dflash2 import DFlash2Spec
from sglang_specopd.wire.drafters.dspark import DSparkSpec
from sglang_specopd.wire.drafters.format import DrafterConfigError, DrafterSpec
from sglang_specopd.wire.drafters.init import init_drafter_tensors
from specopd_trainer.drafters import drafter_class_for_checkpoint
from specopd_trainer.drafters.dflash import DFlashDrafter, DrafterLoadError
from specopd_trainer.drafters.dflash2 import DFlash2Drafter
from specopd_trainer.drafters.dspark import DSparkDrafter
from specopd_trainer.drafters.target_head import TargetHead

REPO = Path(__file__).resolve().parents[1]
V, H, B, R, K, MASK = 11, 32, 4, 6, 4, 5
BASE = dict(hidden_size=H, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            intermediate_size=48, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=V, max_position_embeddings=512,
            block_size=B, target_layer_ids=(1, 3), mask_token="<m>", mask_token_id=MASK, num_target_layers=6)

# Reference configs written from the keys SGLang reads (models/dflash.py, models/dspark.py, dflash_utils.py,
# dspark_config.py), with foreign keys a published HF config carries and specopd does not keep.
FOREIGN = {"attention_dropout": 0.0, "bos_token_id": 1, "transformers_version": "4.57.0"}
QWEN3 = {"model_type": "qwen3", "hidden_size": H, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "hidden_act": "silu",
         "attention_bias": False, "rms_norm_eps": 1e-6,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
         "max_position_embeddings": 512, "vocab_size": V, "tie_word_embeddings": False,
         "layer_types": ["full_attention"] * 2, "use_sliding_window": False, "num_target_layers": 6, "dtype": "float32",
         **FOREIGN}
DFLASH_CFG = {"target_layer_ids": [1, 3], "mask_token": "<m>", "mask_token_id": MASK}
REF = {
    "dflash2": {**QWEN3, "architectures": ["DFlash2DraftModel"], "dflash_config": {
        **DFLASH_CFG, "block_size": B, "conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": R,
        "selector_top_k": K, "output_multiplier": 1.5, "final_logit_softcapping": 30.0}},
    "dspark": {**QWEN3, "architectures": ["DSparkDraftModel"], "dflash_config": {**DFLASH_CFG, "block_size": B - 1},
               "markov_rank": R, "markov_head_type": "gated", "enable_confidence_head": True},
}


def reference_shapes(kind: str) -> dict[str, tuple[int, ...]]:
    """The checkpoint tensors SGLang's DFlash2DraftModel / DSparkDraftModel (gated head) load, listed by hand."""
    out: dict[str, tuple[int, ...]] = {}
    for i in range(2):
        p = f"layers.{i}."
        out.update({p + "input_layernorm.weight": (H,), p + "self_attn.q_proj.weight": (32, H),
                    p + "self_attn.k_proj.weight": (16, H), p + "self_attn.v_proj.weight": (16, H),
                    p + "self_attn.o_proj.weight": (H, 32), p + "self_attn.q_norm.weight": (8,),
                    p + "self_attn.k_norm.weight": (8,), p + "post_attention_layernorm.weight": (H,),
                    p + "mlp.gate_proj.weight": (48, H), p + "mlp.up_proj.weight": (48, H),
                    p + "mlp.down_proj.weight": (H, 48)})
        if kind == "dflash2":  # [side, tap, channel]; projection 2 sides * 2 taps * 4 groups
            out.update({p + f"{c}.{n}": s for c in ("attention_conv", "mlp_conv")
                        for n, s in (("base_kernel", (2, 2, H)), ("kernel_projection.weight", (16, H)))})
    out.update({"fc.weight": (H, 2 * H), "hidden_norm.weight": (H,), "norm.weight": (H,)})
    if kind == "dflash2":
        out.update({"candidate_selector.predecessor_codebook": (V, R), "candidate_selector.successor_codebook": (V, R),
                    "candidate_selector.hidden_projection.weight": (R, H)})
    else:
        out.update({"markov_head.markov_w1.weight": (V, R), "markov_head.markov_w2.weight": (V, R),
                    "markov_head.gate_proj.weight": (R, H + R), "markov_head.gate_proj.bias": (R,),
                    "confidence_head.proj.weight": (1, H + R), "confidence_head.proj.bias": (1,)})
    return out


def make_head(seed: int = 0) -> TargetHead:
    g = torch.Generator().manual_seed(seed)
    return TargetHead(torch.randn(V, H, generator=g), torch.randn(V, H, generator=g))


def v2_spec(**kw) -> DFlash2Spec:
    return DFlash2Spec(**{**BASE, "conv_group_size": 8, "selector_rank": R, "selector_top_k": K, **kw})


def dspark_spec(**kw) -> DSparkSpec:
    return DSparkSpec(**{**BASE, "markov_rank": R, **kw})


def strong(drafter, seed: int):
    """Every tensor random and O(1) (conv kernels identity + noise, norms 1 + noise), so each part matters."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for n, t in drafter.state_dict().items():
        noise = 0.3 * torch.randn(t.shape, generator=g)
        sd[n] = t + noise if n.endswith(("norm.weight", "base_kernel")) else noise
    drafter.load_state_dict(sd)
    return drafter.eval()


DRAFTERS = {
    "dflash2": lambda: DFlash2Drafter(v2_spec(output_multiplier=1.5, final_logit_softcapping=4.0),
                                      target_head=make_head()),
    "dspark-vanilla": lambda: DSparkDrafter(dspark_spec(), target_head=make_head()),
    "dspark-gated": lambda: DSparkDrafter(dspark_spec(markov_head_type="gated"), target_head=make_head()),
    "dspark-rnn": lambda: DSparkDrafter(dspark_spec(markov_head_type="rnn", sample_from_anchor=False),
                                        target_head=make_head()),
}


def inputs(seed: int = 1, length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (length,), generator=g), torch.randn(length, 2 * H, generator=g)


# --------------------------------------------------------------------------------------------------- formats

@pytest.mark.parametrize("kind", ["dflash2", "dspark"])
def test_reference_checkpoint_loads_and_round_trips(kind: str, tmp_path: Path) -> None:
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    (ref / "config.json").write_text(json.dumps(REF[kind]))
    g = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(s, generator=g) for n, s in reference_shapes(kind).items()}
    save_file(tensors, str(ref / "model.safetensors"))
    cls = drafter_class_for_checkpoint(ref)
    assert cls is {"dflash2": DFlash2Drafter, "dspark": DSparkDrafter}[kind]
    d = cls.from_pretrained(ref)
    sd = d.state_dict()
    assert sorted(sd) == sorted(tensors) and all(torch.equal(sd[n], t) for n, t in tensors.items())
    if kind == "dflash2":
        assert (d.spec.conv_kernel_size, d.spec.conv_group_size, d.spec.selector_rank, d.spec.selector_top_k,
                d.spec.output_multiplier, d.spec.final_logit_softcapping, d.block_size) == (2, 8, R, K, 1.5, 30.0, B)
    else:  # config gamma 3 = verify block 4
        assert (d.spec.gamma, d.block_size, d.spec.markov_head_type, d.spec.markov_rank, d.num_query_rows,
                d.spec.confidence_head_with_markov, d.spec.sample_from_anchor) == (3, 4, "gated", R, 3, True, True)
    d.save_pretrained(out)
    saved = json.loads((out / "config.json").read_text())
    assert {k: saved[k] for k in REF[kind] if k not in FOREIGN} == {k: v for k, v in REF[kind].items()
                                                                     if k not in FOREIGN}
    assert parse_drafter_config(saved, kind) == d.spec == parse_drafter_config(REF[kind])
    again = load_file(str(out / "model.safetensors"))
    assert sorted(again) == sorted(tensors) and all(torch.equal(again[n], t) for n, t in tensors.items())


def _problems(cfg: dict, arch: str) -> list[tuple[str, str]]:
    with pytest.raises(DrafterConfigError) as err:
        parse_drafter_config(cfg, arch)
    return err.value.problems


def test_format_errors_are_specific(tmp_path: Path) -> None:
    v2 = json.loads(json.dumps(REF["dflash2"]))
    del v2["dflash_config"]["selector_rank"]
    v2["dflash_config"]["conv_group_size"] = 5
    assert _problems(v2, "dflash2") == [("sglang_refuses", "DFLASH selector needs rank and top_k together. Got "
                                                           "rank=0, top_k=4.")]
    v2["dflash_config"].update(selector_rank=R, selector_top_k=V + 1)
    assert _problems(v2, "dflash2") == [("sglang_refuses", "DFLASH conv_group_size=5 must divide hidden_size=32.")]
    v2["dflash_config"]["conv_group_size"] = 8
    assert _problems(v2, "dflash2") == [("invalid_value", "selector_top_k 12 exceeds vocab_size 11")]
    ds = json.loads(json.dumps(REF["dspark"]))
    ds["dflash_config"]["markov_rank"] = ds.pop("markov_rank")  # nested only: DSparkDraftModel would not see it
    ds["markov_head_type"] = "lstm"
    assert _problems(ds, "dspark") == [("sglang_refuses", "Unsupported DSpark markov_head_type='lstm'. Supported: "
                                                          "('vanilla', 'gated', 'rnn').")]
    ds["markov_head_type"] = "vanilla"
    assert _problems(ds, "dspark") == [("sglang_refuses", "DSpark requires markov_rank > 0 (the Markov head is the "
                                                          "core of the semi-AR draft); got markov_rank=0.")]
    # SGLang ignores enable_confidence_head's value and builds the head from the top-level markov_rank
    spec = parse_drafter_config({**REF["dspark"], "enable_confidence_head": False,
                                 "dspark_config": {"markov_rank": R + 1}}, "dspark")
    assert spec.markov_rank == R
    assert _problems(REF["dspark"], "dflash2") == [(
        "arch_mismatch", "config.json describes a 'DSparkDraftModel' (dspark) drafter, expected a 'DFlash2DraftModel' "
                         "(dflash2) drafter")]
    # a tensor of the wrong shape, and a config of another architecture, fail loudly at load
    d = tmp_path / "d"
    DFlash2Drafter(v2_spec()).save_pretrained(d)
    tensors = load_file(str(d / "model.safetensors"))
    tensors["candidate_selector.successor_codebook"] = torch.zeros(V, R + 1)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(DrafterLoadError, match=r"candidate_selector.successor_codebook: shape \(11, 7\) != \(11, 6\)"):
        DFlash2Drafter.from_pretrained(d)
    with pytest.raises(DrafterConfigError, match=r"architectures must be \['DFlashDraftModel'\], got "
                                                 r"\['DFlash2DraftModel'\]"):
        DFlashDrafter.from_pretrained(d)


# ------------------------------------------------------------------------------------------------- fresh init

def test_fresh_heads_are_identity_and_propose_like_dflash() -> None:
    """Init: identity conv, zero successor codebook, zero Markov bias, so with equal backbone weights a fresh V2
    drafter and a fresh DSpark drafter (non-anchor-first rows) propose exactly what the DFlash drafter proposes."""
    t = init_drafter_tensors(v2_spec(), seed=2)
    assert torch.equal(t["layers.1.mlp_conv.base_kernel"][:, 0], torch.ones(2, H))
    assert not t["layers.1.mlp_conv.base_kernel"][:, 1].any()
    assert not t["layers.0.attention_conv.kernel_projection.weight"].any()
    assert not t["candidate_selector.successor_codebook"].any()
    assert t["candidate_selector.predecessor_codebook"].std() > 0
    td = init_drafter_tensors(dspark_spec(markov_head_type="rnn"), seed=2)
    assert not td["markov_head.markov_w2.weight"].any() and not td["markov_head.joint_proj.bias"].any()
    assert not td["confidence_head.proj.bias"].any() and td["markov_head.markov_w1.weight"].std() > 0

    head = make_head()
    dflash = strong(DFlashDrafter(DrafterSpec(**BASE), target_head=head), seed=4)
    backbone = dflash.state_dict()
    v2 = DFlash2Drafter(v2_spec(), seed=2, target_head=head)
    ds = DSparkDrafter(dspark_spec(markov_head_type="gated", sample_from_anchor=False), seed=2, target_head=head)
    for d in (v2, ds):
        assert d.load_state_dict(backbone, strict=False).unexpected_keys == []
    x = torch.randn(2 * B, H)
    conv = v2.layers[0].attention_conv
    y, delta = conv.prepare(x, B)
    assert torch.equal(y, x) and torch.equal(conv.finish(x, delta, B), x)
    tokens, feats = inputs()
    anchors = [0, 4, 11]
    want = dflash.propose_blocks(feats, tokens, anchors)
    assert torch.equal(v2.propose_blocks(feats, tokens, anchors), want)
    assert torch.equal(ds.propose_blocks(feats, tokens, anchors), want)
    ref_logits, ref_labels = dflash.logits(feats, tokens, anchors)
    logits, labels = ds.logits(feats, tokens, anchors)
    assert torch.equal(labels, ref_labels) and torch.allclose(logits[:, 1:], ref_logits[:, 1:], atol=1e-5)


# ------------------------------------------------------------------------------ conditionals and the sampler

@pytest.mark.parametrize("kind", list(DRAFTERS))
def test_conditionals_match_enumeration_and_sampler(kind: str) -> None:
    """For each block: the branch probabilities prod_k q_k(y_k | y_<k) over ALL 11^3 branches sum to 1; the
    left-to-right sampler's log q equals the teacher-forced one, its empirical branch frequencies match them, and
    the greedy walk takes each slot's argmax given its own prefix."""
    d = strong(DRAFTERS[kind](), seed=7)
    tokens, feats = inputs()
    temp, n = 0.8, 30000
    with torch.no_grad():
        hidden, labels, anchor = d.slot_hidden(feats, tokens, [2, 7])
        branches = torch.tensor(list(itertools.product(range(V), repeat=B - 1)))
        for b in range(2):
            h, a = hidden[b:b + 1], anchor[b:b + 1]
            logq = d.branch_log_probs(h.expand(len(branches), -1, -1), a.expand(len(branches)), branches, temp)
            p = logq.sum(dim=1).exp()
            assert abs(float(p.sum()) - 1.0) < 1e-5
            if kind == "dflash2":  # q lives on the K candidates of each slot: at most K^3 branches
                assert 1 <= int((p > 0).sum()) <= K ** (B - 1)
            g = torch.Generator().manual_seed(b)
            drawn, drawn_logq = d.sample_branches(h.expand(n, -1, -1), a.expand(n), temp, generator=g)
            index = (drawn * torch.tensor([V * V, V, 1])).sum(dim=1)
            assert torch.allclose(drawn_logq, logq[index], atol=1e-5)
            freq = torch.bincount(index, minlength=len(branches)).double() / n
            sigma = (p.double() * (1 - p.double()) / n).sqrt()
            assert bool(((freq - p.double()).abs() <= 5 * sigma + 2e-3).all()), float((freq - p).abs().max())
            greedy, greedy_logq = d.sample_branches(h, a, 0.0)
            assert not greedy_logq.any()  # temperature 0: a point mass
            cond = d.conditional_logits(h, a, greedy)
            if kind == "dflash2":  # the walk's argmax is over each slot's candidates, whose served scores are the
                ids, scores = d.candidate_scores(h, a, greedy)  # full-vocabulary scores restricted to them
                assert torch.equal(ids.gather(-1, scores.argmax(-1, keepdim=True))[..., 0], greedy)
                assert torch.allclose(cond.gather(-1, ids), scores, atol=1e-5)
            else:
                assert torch.equal(cond.argmax(-1), greedy)


def test_training_logits_proposals_and_gradients() -> None:
    for kind in ("dflash2", "dspark-rnn"):
        d = strong(DRAFTERS[kind](), seed=3)
        tokens, feats = inputs(length=10)
        anchors = [0, 5, 9]
        logits, labels = d.logits(feats, tokens, anchors)
        assert logits.shape == (3, B, V) and not logits[:, 0].any()
        assert labels[:, 0].eq(-100).all() and labels[0, 1:].tolist() == tokens[1:4].tolist()
        assert labels[2].eq(-100).all()  # anchor 9 is the last token: nothing to draft against
        hidden, _, anchor = d.slot_hidden(feats, tokens, anchors)
        assert torch.allclose(logits[:2, 1:], d.conditional_logits(hidden[:2], anchor[:2], labels[:2, 1:]))
        served = torch.stack([d.propose(feats[:a], int(tokens[a]), a) for a in anchors])
        assert torch.equal(d.propose_blocks(feats, tokens, anchors), served)  # training mask == one served block
        with pytest.raises(NotImplementedError, match="slots are not independent"):  # SpecOPD's DFlash-only path
            d.block_hidden(feats, tokens, anchors)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
        loss.backward()
        head = d.candidate_selector.successor_codebook if kind == "dflash2" else d.markov_head.joint_proj.weight
        assert torch.isfinite(loss) and head.grad is not None and head.grad.abs().sum() > 0


# ------------------------------------------------------------------------------------------ parity with SGLang

@pytest.mark.slow
def test_parity_with_sglang_model_classes(tmp_path: Path) -> None:
    """The same random checkpoints loaded into SGLang's own DFlash2DraftModel / DSparkDraftModel (CPU, fp32; see
    tests/_sglang_semi_ar_parity.py): equal slot hidden states, candidates, greedy proposals (T=0), SGLang's
    sampled V2 path for the same uniforms with its q rows, DSpark step logits along SGLang's sampled path, and the
    confidence head."""
    g = torch.Generator().manual_seed(11)
    tokens, feats = inputs(seed=5, length=9)
    head = make_head()
    uniforms = torch.rand(B - 1, generator=g)
    save_file({"features": feats, "embed": head.embed, "lm_head": head.lm_head, "uniforms": uniforms},
              str(tmp_path / "inputs.safetensors"))
    anchor_token, temps = int(tokens[8]), {"dflash2": 0.7, "dspark": 1.3}
    drafters, cases = {}, []
    for i, kind in enumerate(DRAFTERS):
        d = strong(DRAFTERS[kind](), seed=20 + i)
        d.save_pretrained(tmp_path / kind)
        drafters[kind] = d
        arch = kind.split("-")[0]
        cases.append({"kind": arch, "drafter": str(tmp_path / kind), "inputs": str(tmp_path / "inputs.safetensors"),
                      "block_size": B, "temperature": temps[arch],
                      "scalars": {"anchor_token": anchor_token, "mask_token_id": MASK}})
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1",
           "SGLANG_RAGGED_VERIFY_MODE": "cap-accept"}
    from sglang_specopd.server.cpu import STANDIN_DIR

    env["PYTHONPATH"] = f"{STANDIN_DIR}{os.pathsep}{REPO}"
    res = subprocess.run([sys.executable, str(REPO / "tests" / "_sglang_semi_ar_parity.py"), json.dumps(cases)],
                         capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    anchor = torch.tensor([anchor_token])
    with torch.no_grad():
        for (kind, d), got in zip(drafters.items(), json.loads(lines[-1][len("RESULT "):])):
            assert got["unloaded"] == [], kind
            hidden = d.serve_slot_hidden(feats, anchor_token, 9)
            assert torch.allclose(hidden[0], torch.tensor(got["hidden"]), atol=2e-5), kind
            assert d.propose(feats, anchor_token, 9).tolist() == got["greedy"], kind
            temp = temps[kind.split("-")[0]]
            if kind == "dflash2":
                assert d.candidates(hidden)[0][0].tolist() == got["candidates"]
                assert d.sample_branches(hidden, anchor, temp, uniforms=uniforms.view(1, -1))[0][0].tolist() \
                    == got["sampled"]
                _, scores = d.candidate_scores(hidden, anchor, torch.tensor([got["sampled"]]))
                q = torch.tensor(got["sampled_q"])
                assert torch.allclose(torch.softmax(scores[0] / temp, -1), q, atol=1e-5)
                q = torch.tensor(got["greedy_q"])  # greedy rows: q is the point mass on the walked candidate
                assert q.eq(1).sum(-1).eq(1).all() and q.sum(-1).eq(1).all()
                assert [c[i] for c, i in zip(got["candidates"], q.argmax(-1).tolist())] == got["greedy"]
            else:
                assert got["has_confidence_head"] and got["stacked_ctx_kv"] and got["gamma"] == B - 1
                assert got["rows"] == d.num_query_rows == (B if kind == "dspark-rnn" else B - 1)
                step = d.conditional_logits(hidden, anchor, torch.tensor([got["sampled"]]))[0]
                assert torch.allclose(step, torch.tensor(got["sampled_step_logits"]), atol=5e-5), kind
                conf, raw = d.confidence(hidden, anchor, torch.tensor([got["greedy"]]))
                assert torch.allclose(raw[0], torch.tensor(got["confidence_raw"]), atol=2e-5), kind
                assert torch.allclose(conf[0], torch.tensor(got["confidence"]), atol=1e-5), kind


# -------------------------------------------------------------------------------------------- drafter init/check

def test_cli_init_and_check(tiny_target6: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    run = CliRunner().invoke
    t = str(tiny_target6)
    v2, ds = tmp_path / "v2", tmp_path / "ds"
    res = run(app, ["drafter", "init", "--arch", "dflash2", "--target", t, "--out", str(v2), "--block-size", "4",
                    "--num-layers", "1", "--option", "selector_rank=4", "--option", "selector_top_k=3"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == str(v2)
    assert "conv 2 taps / group 16, selector rank 4 top-3" in res.stderr
    cfg = json.loads((v2 / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["dflash_config"]["selector_top_k"] == 3
    res = run(app, ["drafter", "check", str(v2), "--target", t, "--arch", "dflash2"])
    assert res.exit_code == 0 and res.stdout.startswith(f"ok: {v2}: 1 layers x hidden 64"), res.output
    res = run(app, ["drafter", "init", "--arch", "dspark", "--target", t, "--out", str(ds), "--block-size", "8",
                    "--num-layers", "1", "--option", "markov_head_type=rnn", "--option", "markov_rank=8"])
    assert res.exit_code == 0, res.output
    cfg = json.loads((ds / "config.json").read_text())
    assert (cfg["architectures"], cfg["dflash_config"]["block_size"], cfg["markov_head_type"]) == (
        ["DSparkDraftModel"], 7, "rnn")
    assert "gamma 7 (verify block 8)" in res.stderr and "markov rnn rank 8" in res.stderr
    assert check_drafter(ds, tiny_target6, "dspark") == []
    res = run(app, ["drafter", "check", str(ds), "--target", t, "--arch", "dflash2"])
    assert res.exit_code == 2 and "describes a 'DSparkDraftModel' (dspark) drafter, expected a " \
                                  "'DFlash2DraftModel' (dflash2) drafter" in res.stderr
    for arch, option in (("dspark", "markov_rnak=3"), ("dflash", "selector_rank=4")):
        res = run(app, ["drafter", "init", "--arch", arch, "--target", t, "--out", str(tmp_path / "x"),
                        "--option", option])
        assert res.exit_code == 2 and "unknown option(s) " + option.split("=")[0] in res.stderr, res.output
    assert not (tmp_path / "x").exists()
    tensors = load_file(str(ds / "model.safetensors"))
    tensors["confidence_head.proj.bias"] = torch.zeros(2)
    save_file(tensors, str(ds / "model.safetensors"))
    cfg.pop("markov_rank")
    (ds / "config.json").write_text(json.dumps(cfg))
    assert [p.message for p in check_drafter(ds, tiny_target6, "dspark")] == [
        "DSPARK requires markov_rank > 0 in the draft config, got markov_rank=0."]
    cfg["markov_rank"] = 8
    (ds / "config.json").write_text(json.dumps(cfg))
    assert [p.message for p in check_drafter(ds, tiny_target6, "dspark")] == [
        "tensor confidence_head.proj.bias has shape [2], expected [1]"]
