"""``specopd serve --dry-run`` (issue 40 part 5): every ``gpu-*`` server config checked on CPU without its weights
(the published config.json files in tests/fixtures/gpu_checkpoints/ stand in for the checkpoints), and the exact
SGLang command it would run; a config SGLang would refuse fails with the reason, exit 2."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "gpu_checkpoints"
GPU_CONFIGS = sorted(p.stem for p in (REPO / "server_configs").glob("gpu-*.yaml"))


def _invoke(*args: str):
    from typer.testing import CliRunner

    from sglang_specopd.app.cli.entry import _register_subcommands, app

    _register_subcommands()
    return CliRunner().invoke(app, ["serve", *args, "--dry-run"])


def _fixture_args(config: str) -> list[str]:
    cfg = yaml.safe_load((REPO / "server_configs" / f"{config}.yaml").read_text())
    args = []
    for flag, key in (("--target-config", "target"), ("--drafter-config", "drafter")):
        d = FIXTURES / Path(str(cfg.get(key))).name
        if (d / "config.json").is_file():
            args += [flag, str(d)]
    return args


def test_every_gpu_config_is_covered() -> None:
    assert GPU_CONFIGS == ["gpu-qwen3-8b-adapt", "gpu-qwen3-8b-dflash", "gpu-qwen3-next-gdn"]


@pytest.mark.parametrize("config", GPU_CONFIGS)
def test_gpu_config_dry_run(config: str) -> None:
    res = _invoke("--config", config, *_fixture_args(config))
    assert res.exit_code == 0, res.output
    lines = res.stderr.splitlines()
    assert not [line for line in lines if line.startswith("error: ")]
    assert f"note: config '{config}' has not yet been checked on a GPU" in lines
    cfg = yaml.safe_load((REPO / "server_configs" / f"{config}.yaml").read_text())
    argv = shlex.split(res.stdout.strip().splitlines()[-1])
    cmd = argv[argv.index("-m"):]
    assert cmd[:2] == ["-m", "sglang.launch_server"]
    pairs = dict(zip(cmd[2::1], cmd[3::1]))
    assert pairs["--model-path"] == cfg["target"]
    assert pairs["--served-model-name"] == cfg.get("served_model_name", Path(cfg["target"]).name)
    assert pairs["--speculative-algorithm"] == "SPECOPD" and pairs["--speculative-draft-model-path"] == cfg["drafter"]
    assert pairs["--speculative-dflash-block-size"] == str(cfg["block_size"]) and pairs["--device"] == "cuda"
    assert all(a in cmd for a in cfg.get("extra_sglang_args", []))
    env = dict(a.split("=", 1) for a in argv[:argv.index("-m") - 1])
    assert env["SPECOPD_PREFIX_CACHE_MB"] == str(cfg.get("score_trees_prefix_cache_mb", 0))
    assert "SGLANG_USE_CPU_ENGINE" not in env
    # every GPU config scores in pieces (generation never stalls for a whole score request)
    assert int(env["SPECOPD_SCORE_BUDGET_TOKENS"]) == cfg["score_trees_budget_tokens"] > 0
    if config == "gpu-qwen3-8b-adapt":  # spool, served features, goodput, real-size drafter pushes
        assert env["SPECOPD_TRAFFIC_SPOOL_BYTES"] == str(256 * 2**20)
        assert env["SPECOPD_TRAFFIC_FEATURES_BYTES"] == str(8192 * 2**20)
        assert env["SPECOPD_DRAFTER_MAX_PAYLOAD_MB"] == "4096" and pairs["--served-model-name"] == "qwen3-8b"
        assert json.loads(env["SPECOPD_SPECULATIVE_POLICY"])["policy"] == "goodput"
    if config in ("gpu-qwen3-8b-dflash", "gpu-qwen3-8b-adapt"):  # the z-lab drafter's config, resolved as SGLang resolves it
        assert "ok: sglang will use: block_size 16 (top-level block_size)" in lines
        assert "ok: sglang will use: target_layer_ids [1, 9, 17, 25, 33] (dflash_config.target_layer_ids)" in lines
        assert "ok: sglang will use: mask_token_id 151669 (dflash_config.mask_token_id)" in lines
        assert any(line.startswith("note: not checked: drafter weights are not in") for line in lines)
    else:  # Qwen3-Next on 4 ranks: 16 heads, 2 KV heads (replicated), GDN 16 / 32 heads, MoE 512 wide
        assert "ok: --tp-size 4: the target's heads, KV heads and MLP widths split evenly" in lines
        assert "note: not checked: drafter /models/Qwen3-Next-80B-A3B-DFlash-b16 is not here (set in config " \
               "'gpu-qwen3-next-gdn')" in lines


def _variant(tmp_path: Path, config: str, **update) -> Path:
    cfg = {**yaml.safe_load((REPO / "server_configs" / f"{config}.yaml").read_text()), **update}
    out = tmp_path / f"{config}-variant.yaml"
    out.write_text(yaml.safe_dump(cfg))
    return out


@pytest.mark.parametrize(("update", "extra", "error"), [
    ({"extra_sglang_args": ["--tp-size", "3"]}, [],
     "error: target: attention heads 32 is not divisible by --tp-size 3"),
    ({"extra_sglang_args": ["--tp-size=12"]}, [], "error: drafter: attention heads 32 is not divisible by "
                                                   "--tp-size 12"),
    ({"attention_backend": "flash"}, [], "error: attention_backend 'flash' is not one of SGLang 0.5.23's: "),
    ({"speculative_algorithm": "DSPARK"}, [], "--speculative-algorithm DSPARK serves DSPARK drafters only"),
    ({"drafter": "default"}, [], "error: config 'gpu-qwen3-8b-dflash': `drafter: default` but no drafter ships for "
                                 "Qwen3-8B (block 16), so it would serve a random-init drafter; set "
                                 "allow_random_drafter: true"),
])
def test_what_sglang_would_refuse_fails(tmp_path: Path, update: dict, extra: list, error: str) -> None:
    res = _invoke("--config", str(_variant(tmp_path, "gpu-qwen3-8b-dflash", **update)),
                  *_fixture_args("gpu-qwen3-8b-dflash"), *extra)
    assert res.exit_code == 2, res.output
    assert any(error in line for line in res.stderr.splitlines()), res.stderr
    assert "sglang.launch_server" in res.stdout  # the command is still shown


def test_served_model_name_and_allowed_random_drafter(tmp_path: Path) -> None:
    """``served_model_name`` becomes SGLang's ``--served-model-name``; ``allow_random_drafter: true`` lets
    ``drafter: default`` serve the random-init drafter of a target with none shipped (issue 54)."""
    res = _invoke("--config", str(_variant(tmp_path, "gpu-qwen3-8b-dflash", served_model_name="qwen3-8b",
                                           drafter="default", allow_random_drafter=True)),
                  *_fixture_args("gpu-qwen3-8b-dflash"))
    assert res.exit_code == 0, res.output
    argv = shlex.split(res.stdout.strip().splitlines()[-1])
    assert argv[argv.index("--served-model-name") + 1] == "qwen3-8b"
    assert "allow_random_drafter" not in res.stderr


def test_drafter_refused_by_sglang_and_block_mismatch(tmp_path: Path) -> None:
    """A drafter config SGLang refuses is one error with SGLang's reason; a config block size other than the
    drafter's is a note (SGLang serves the flag's and warns)."""
    bad = tmp_path / "drafter"
    bad.mkdir()
    cfg = json.loads((FIXTURES / "Qwen3-8B-DFlash-b16" / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [1, 9, 17, 25, 36]
    (bad / "config.json").write_text(json.dumps(cfg))
    res = _invoke("--config", "gpu-qwen3-8b-dflash", "--target-config", str(FIXTURES / "Qwen3-8B"),
                  "--drafter-config", str(bad))
    assert res.exit_code == 2
    assert ("error: drafter: DFLASH target_layer_ids contains an out-of-range layer id. target_layer_ids[4]=36, "
            "target_num_layers=36.") in res.stderr.splitlines()
    res = _invoke("--config", str(_variant(tmp_path, "gpu-qwen3-8b-dflash", block_size=8)),
                  *_fixture_args("gpu-qwen3-8b-dflash"))
    assert res.exit_code == 0, res.output
    assert ("note: block_size 8 in the config, 16 in the drafter: SGLang serves the config's and warns"
            in res.stderr.splitlines())


def test_tp_split_rules() -> None:
    """SGLang splits heads and MLP widths over the ranks; KV heads fewer than the ranks are replicated, which
    needs the ranks to be a multiple of them."""
    from sglang_specopd.app.serve.dry_run import tp_problems, tp_size

    assert tp_problems({"num_attention_heads": 16, "num_key_value_heads": 2, "intermediate_size": 5120}, 4, "t") == []
    assert tp_problems({"num_attention_heads": 12, "num_key_value_heads": 3}, 4, "t") == [
        "t: KV heads 3 < --tp-size 4 must divide it (replicated)"]
    assert tp_problems({"text_config": {"num_attention_heads": 16, "linear_num_value_heads": 6}}, 4, "t") == [
        "t: GDN value heads (linear_num_value_heads) 6 is not divisible by --tp-size 4"]
    assert tp_size(["--mem-fraction-static", "0.8", "--tp", "2"]) == 2 and tp_size([]) == 1
    with pytest.raises(ValueError):
        tp_size(["--tp-size", "four"])
