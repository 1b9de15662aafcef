"""Which drafter ``specopd demo`` (and ``specopd serve``) serves, and that the demo says so. No server is started.

``specopd main`` saves an SFT drafter as ``$SPECOPD_HOME/drafters/<target>-sft-b<B>`` and the SpecOPD-trained one
as ``$SPECOPD_HOME/main_job/drafter-specopd``; the demo must serve the newest of those that fits the target and the
config's block size, fall back to the random-init default otherwise, and print the path and the reason.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sglang_specopd.app.config import ServeConfig
from sglang_specopd.app.serve import DEFAULT_HOW, choose_drafter

BLOCK = 4  # conftest.TINY_BLOCK_SIZE: the tiny drafter's block size


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECOPD_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _cfg(target: Path, **update) -> ServeConfig:
    base = {"name": "tiny-demo", "target": str(target), "drafter": "default", "block_size": BLOCK, "device": "cpu",
            "dtype": "float32", "attention_backend": "torch_native", "max_total_tokens": 2048,
            "disable_cuda_graph": True, "disable_overlap_schedule": True}
    return ServeConfig(**{**base, **update})


def _place(src: Path, dest: Path, mtime: float) -> Path:
    """Copy drafter ``src`` to ``dest`` (as the main job would have saved it) with weights saved at ``mtime``."""
    shutil.copytree(src, dest)
    os.utime(dest / "model.safetensors", (mtime, mtime))
    return dest


def _sft(home: Path, target: Path) -> Path:
    return home / "drafters" / f"{target.name}-sft-b{BLOCK}"


def _specopd(home: Path) -> Path:
    return home / "main_job" / "drafter-specopd"


def test_no_trained_drafter_serves_the_random_default(home: Path, tiny_target: Path) -> None:
    choice = choose_drafter(_cfg(tiny_target), tiny_target, prefer_trained=True)
    assert choice.path == home / "drafters" / f"{tiny_target.name}-b{BLOCK}-l2"
    assert choice.how == DEFAULT_HOW


def test_newest_trained_drafter_wins(home: Path, tiny_target: Path, tiny_drafter: Path) -> None:
    cfg = _cfg(tiny_target)
    sft = _place(tiny_drafter, _sft(home, tiny_target), 1_000_000)
    choice = choose_drafter(cfg, tiny_target, prefer_trained=True)
    assert choice.path == sft
    assert choice.how.startswith("newest trained drafter: SFT drafter of `specopd main`"), choice.how

    specopd = _place(tiny_drafter, _specopd(home), 2_000_000)
    choice = choose_drafter(cfg, tiny_target, prefer_trained=True)
    assert choice.path == specopd
    assert "SpecOPD drafter of `specopd main`" in choice.how

    os.utime(sft / "model.safetensors", (3_000_000, 3_000_000))  # a later SFT is newer than that SpecOPD run
    assert choose_drafter(cfg, tiny_target, prefer_trained=True).path == sft


def test_trained_drafters_that_do_not_fit_are_skipped(home: Path, tiny_target: Path, tiny_drafter: Path,
                                                      tmp_path: Path) -> None:
    from sglang_specopd.wire.drafter_init import init_drafter

    cfg = _cfg(tiny_target)
    sft = _place(tiny_drafter, _sft(home, tiny_target), 1_000_000)
    # newest, but block 8 while the config serves block 4
    init_drafter(tiny_target, tmp_path / "b8", block_size=8, num_layers=1, seed=0)
    _place(tmp_path / "b8", _specopd(home), 2_000_000)
    assert choose_drafter(cfg, tiny_target, prefer_trained=True).path == sft
    # newest and the right block size, but its weights are truncated
    shutil.rmtree(_specopd(home))
    broken = _place(tiny_drafter, _specopd(home), 2_000_000)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    os.utime(broken / "model.safetensors", (2_000_000, 2_000_000))
    assert choose_drafter(cfg, tiny_target, prefer_trained=True).path == sft
    # nothing fits any more: the random default
    shutil.rmtree(sft)
    assert choose_drafter(cfg, tiny_target, prefer_trained=True).how == DEFAULT_HOW


def test_explicit_choices_beat_trained_drafters(home: Path, tiny_target: Path, tiny_drafter: Path) -> None:
    _place(tiny_drafter, _specopd(home), 2_000_000)
    given = choose_drafter(_cfg(tiny_target), tiny_target, override=str(tiny_drafter), prefer_trained=True)
    assert (given.path, given.how) == (tiny_drafter, "given with --drafter")
    in_cfg = choose_drafter(_cfg(tiny_target, drafter=str(tiny_drafter)), tiny_target, prefer_trained=True)
    assert (in_cfg.path, in_cfg.how) == (tiny_drafter, "set in config 'tiny-demo'")
    plain = choose_drafter(_cfg(tiny_target, drafter=None), tiny_target, prefer_trained=True)
    assert plain.path is None and "without a drafter" in plain.how
    # `specopd serve` keeps `drafter: default` meaning the random-init default
    serve = choose_drafter(_cfg(tiny_target), tiny_target)
    assert serve.path == home / "drafters" / f"{tiny_target.name}-b{BLOCK}-l2"
    assert "random-init default" in serve.how


def test_demo_serves_and_names_the_trained_drafter(home: Path, tiny_target: Path, tiny_drafter: Path,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the CLI: the launch gets the newest trained drafter and the output names it and why."""
    import yaml
    from typer.testing import CliRunner

    import sglang_specopd.app.cli_demo  # noqa: F401  (registers `demo` on the app)
    import sglang_specopd.app.launch as launch
    from sglang_specopd.app.cli_apps import app

    specopd = _place(tiny_drafter, _specopd(home), 2_000_000)
    launched = []

    class FakeServer:  # stands in for SGLang: records the spec and fails to start
        def __init__(self, spec, log_path=None):
            launched.append(spec)

        def start(self, timeout: float = 600.0):
            raise launch.ServeError("fake server: not started")

    monkeypatch.setattr(launch, "SGLangServer", FakeServer)
    cfg_file = tmp_path / "demo.yaml"
    cfg_file.write_text(yaml.safe_dump(_cfg(tiny_target).model_dump(exclude_defaults=True)))
    result = CliRunner().invoke(app, ["demo", "--config", str(cfg_file)])
    assert result.exit_code == 1, result.output
    assert len(launched) == 1 and launched[0].drafter_path == str(specopd)
    out = result.output
    assert f"drafter: {specopd} (newest trained drafter: SpecOPD drafter of `specopd main`" in out, out
    assert "error: fake server: not started" in out
