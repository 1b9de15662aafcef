"""Server configs: strict schema, path resolution, and every shipped config in server_configs/ loads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sglang_specopd.app.config import ConfigError, ServeConfig
from sglang_specopd.app.cpu_dtype import cpu_has_native_bf16
from sglang_specopd.app.serve.spec import config_path, launch_spec

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "server_configs").glob("*.yaml"))
MINIMAL = {"name": "t", "target": "smollm2"}


def write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_minimal_config_defaults(tmp_path: Path) -> None:
    cfg = ServeConfig.load(write(tmp_path / "c.yaml", MINIMAL))
    assert cfg.target == "smollm2" and cfg.drafter is None and cfg.speculative_algorithm == "SPECOPD"
    assert cfg.device == "cuda" and cfg.dtype == "auto" and cfg.extra_sglang_args == []


@pytest.mark.parametrize("key", ["max_tokens", "Device", "drafter_path", "speculative-algorithm"])
def test_unknown_keys_rejected(tmp_path: Path, key: str) -> None:
    path = write(tmp_path / "c.yaml", {**MINIMAL, key: 1})
    with pytest.raises(ConfigError) as err:
        ServeConfig.load(path)
    msg = str(err.value)
    assert str(path) in msg and key in msg and "Extra inputs are not permitted" in msg


@pytest.mark.parametrize(("field", "value"), [
    ("block_size", "eight"), ("block_size", 1), ("block_size", 65), ("device", "tpu"), ("dtype", "int8"),
    ("speculative_algorithm", "EAGLE"), ("max_total_tokens", 0), ("max_total_tokens", -5),
    ("mem_fraction_static", 1.5), ("disable_cuda_graph", "sometimes"), ("extra_sglang_args", "--foo"),
    ("name", ["a", "b"]), ("target", None), ("max_running_requests", 2.5),
])
def test_bad_values_rejected(tmp_path: Path, field: str, value) -> None:
    with pytest.raises(ConfigError) as err:
        ServeConfig.load(write(tmp_path / "c.yaml", {**MINIMAL, field: value}))
    assert field in str(err.value)


def test_every_problem_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        ServeConfig.load(write(tmp_path / "c.yaml", {**MINIMAL, "device": "tpu", "block_size": 0, "bogus": 1}))
    msg = str(err.value)
    assert "device" in msg and "block_size" in msg and "bogus" in msg


def test_missing_required_and_non_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="target"):
        ServeConfig.load(write(tmp_path / "a.yaml", {"name": "t"}))
    with pytest.raises(ConfigError, match="mapping"):
        ServeConfig.load(write(tmp_path / "b.yaml", "- just\n- a list\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        ServeConfig.load(write(tmp_path / "c.yaml", "name: [x\n"))
    with pytest.raises(ConfigError, match="not found"):
        ServeConfig.load(tmp_path / "absent.yaml")


def test_relative_paths_resolved_against_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sub = tmp_path / "configs" / "nested"
    sub.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # resolution must not depend on the working directory
    cfg = ServeConfig.load(write(sub / "c.yaml", {**MINIMAL, "target": "./models/t", "drafter": "../drafters/d"}))
    assert cfg.target == str((sub / "models" / "t").resolve())
    assert cfg.drafter == str((tmp_path / "configs" / "drafters" / "d").resolve())
    assert Path(cfg.target).is_absolute() and Path(cfg.drafter).is_absolute()
    # names and absolute paths are kept as written
    cfg = ServeConfig.load(write(sub / "d.yaml", {**MINIMAL, "target": "smollm2", "drafter": "default"}))
    assert (cfg.target, cfg.drafter) == ("smollm2", "default")
    cfg = ServeConfig.load(write(sub / "e.yaml", {**MINIMAL, "target": "/abs/t"}))
    assert cfg.target == "/abs/t"


def test_config_is_frozen(tmp_path: Path) -> None:
    cfg = ServeConfig.load(write(tmp_path / "c.yaml", MINIMAL))
    with pytest.raises(Exception):
        cfg.device = "cpu"  # type: ignore[misc]


def test_shipped_configs_exist() -> None:
    assert len(SHIPPED) >= 3, SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_config_loads(path: Path) -> None:
    cfg = ServeConfig.load(path)
    assert cfg.name == path.stem, "a config's name is the name `specopd serve --config NAME` finds it by"
    assert config_path(path.stem) == path
    if cfg.drafter is not None:
        assert cfg.speculative_algorithm is not None and cfg.block_size
    if cfg.device == "cpu":
        # the flags SGLang needs on this CPU (see docs/notes): torch_native, no CUDA graphs, no overlap, bounded KV
        assert cfg.attention_backend == "torch_native"
        assert cfg.disable_cuda_graph and cfg.disable_overlap_schedule and cfg.sleep_on_idle
        assert cfg.max_total_tokens is not None
        assert cfg.checked_on_gpu is False


@pytest.mark.parametrize("device,dtype,flags,want", [
    ("cpu", "auto", ["fma", "avx2"], "float32"),                      # AVX2 only: bf16 would be emulated
    ("cpu", "auto", ["avx512f", "avx512bw"], "float32"),              # AVX-512 without bf16 arithmetic
    ("cpu", "auto", ["avx512f", "avx512_bf16"], "bfloat16"),
    ("cpu", "auto", ["amx_tile", "amx_bf16"], "bfloat16"),
    ("cpu", "bfloat16", ["avx2"], "bfloat16"),                         # an explicit dtype is never changed
    ("cpu", "float32", ["avx512_bf16"], "float32"),
    ("cuda", "auto", [], "auto"),                                      # GPU: SGLang resolves auto itself
])
def test_cpu_auto_dtype_follows_native_bf16(device, dtype, flags, want) -> None:
    from sglang_specopd.app.cpu_dtype import resolve_dtype

    assert resolve_dtype(device, dtype, flags) == want


def test_cpu_flags_parse_cpuinfo(tmp_path: Path) -> None:
    from sglang_specopd.app.cpu_dtype import cpu_flags

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags : sse\n")
    assert cpu_flags(info) == frozenset({"fpu", "avx2", "amx_bf16"})
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_cpu_configs_build_the_cpu_launch_flags(tiny_target: Path, tiny_drafter: Path) -> None:
    """launch_spec on each shipped CPU config (target/drafter swapped for the tiny ones) gives SGLang's CPU flags."""
    from sglang_specopd.app.launch.process import free_port

    cpu_cfgs = [ServeConfig.load(p) for p in SHIPPED if ServeConfig.load(p).device == "cpu"]
    assert cpu_cfgs
    for cfg in cpu_cfgs:
        drafter = str(tiny_drafter) if cfg.drafter else None
        cfg = cfg.model_copy(update={"target": str(tiny_target), "drafter": drafter,
                                     "block_size": 4 if drafter else cfg.block_size})
        argv = launch_spec(cfg, port=free_port(), extra_args=["--log-level", "warning"]).argv()
        joined = " ".join(argv)
        dtype = {"auto": "bfloat16" if cpu_has_native_bf16() else "float32"}.get(cfg.dtype, cfg.dtype)
        for flag in ("--device cpu", f"--dtype {dtype}", "--attention-backend torch_native",
                     f"--max-total-tokens {cfg.max_total_tokens}", "--disable-cuda-graph",
                     "--disable-overlap-schedule", "--sleep-on-idle"):
            assert flag in joined, (cfg.name, flag, argv)
        if drafter:
            for flag in ("--speculative-algorithm SPECOPD", f"--speculative-draft-model-path {tiny_drafter}",
                         "--speculative-dflash-block-size 4", "--speculative-draft-attention-backend torch_native"):
                assert flag in joined, (cfg.name, flag, argv)
        else:
            assert "--speculative-algorithm" not in joined
        assert argv[-2:] == ["--log-level", "warning"]


def test_gpu_hybrid_gdn_config_takes_the_gpu_path(tiny_target: Path, tiny_drafter: Path) -> None:
    """``gpu-qwen3-next-gdn`` (issue 21 part 5): the SPECOPD worker on a hybrid Gated DeltaNet target with SGLang's
    own GPU kernels; none of the CPU adaptations (CPU engine, ``sgl_kernel`` stand-in, torch_native backends, fp32
    conv windows); ``/specopd/score_trees`` replays GDN states with the torch replay on CUDA tensors until the GPU
    acceptance run verifies the Triton tree kernel (``specopd_kernels.verified``; ``SPECOPD_GDN_REPLAY=triton``
    forces it), and on CPU ones; still marked unverified, since no GPU with SGLang has run it."""
    import torch

    from sglang_specopd.app.launch.process import free_port, server_env
    from sglang_specopd.server.cpu import STANDIN_DIR
    from sglang_specopd.server.scoring.gdn import gdn_tree_replay_fn
    from specopd_kernels.gdn import gdn_tree_replay, gdn_tree_replay_triton

    path = config_path("gpu-qwen3-next-gdn")
    cfg = ServeConfig.load(path)
    assert cfg.checked_on_gpu is False and "NOT YET CHECKED ON A GPU" in path.read_text()
    assert cfg.device == "cuda" and cfg.speculative_algorithm == "SPECOPD" and cfg.drafter and cfg.block_size
    assert cfg.attention_backend is None and not cfg.disable_cuda_graph  # SGLang picks its GPU backends
    # target / drafter swapped for the tiny ones (the real checkpoints are not on this machine); block size kept
    local = cfg.model_copy(update={"target": str(tiny_target), "drafter": str(tiny_drafter)})
    spec = launch_spec(local, port=free_port())
    joined = " ".join(spec.argv())
    for flag in ("--device cuda", "--dtype bfloat16", "--speculative-algorithm SPECOPD",
                 f"--speculative-dflash-block-size {cfg.block_size}", "--max-mamba-cache-size"):
        assert flag in joined, (flag, joined)
    assert "torch_native" not in joined and "--disable-cuda-graph" not in joined
    env = server_env(spec.device, base={"PYTHONPATH": "/x"})
    assert "SGLANG_USE_CPU_ENGINE" not in env and "SGLANG_MAMBA_CONV_DTYPE" not in env
    assert str(STANDIN_DIR) not in env["PYTHONPATH"]
    from specopd_kernels import verified

    if not verified.is_verified("gdn_replay_triton")[0]:
        assert gdn_tree_replay_fn(torch.device("cuda")) is gdn_tree_replay
    os.environ["SPECOPD_GDN_REPLAY"] = "triton"
    try:
        assert gdn_tree_replay_fn(torch.device("cuda")) is gdn_tree_replay_triton
    finally:
        del os.environ["SPECOPD_GDN_REPLAY"]
    assert gdn_tree_replay_fn(torch.device("cpu")) is gdn_tree_replay
