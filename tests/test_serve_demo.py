"""Which drafter ``specopd demo`` (and ``specopd serve``) serves, and that the demo says so. No server is started.

``specopd main`` saves the drafter it adapted to new traffic as ``$SPECOPD_HOME/main_job/drafter-adapted`` (earlier
versions saved an SFT drafter as ``$SPECOPD_HOME/drafters/<target>-sft-b<B>``); the demo must serve the newest of those that fits the target and the
config's block size, fall back to the random-init default otherwise, and print the path and the reason.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sglang_specopd.app.config import ServeConfig
from sglang_specopd.app.serve.choice import DEFAULT_HOW, choose_drafter

BLOCK = 4  # conftest.TINY_BLOCK_SIZE: the tiny drafter's block size


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECOPD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECOPD_REFERENCE_DRAFTERS", str(tmp_path / "reference"))  # none ships unless a test puts one
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
    return home / "main_job" / "drafter-adapted"


def test_no_trained_drafter_serves_the_random_default(home: Path, tiny_target: Path) -> None:
    choice = choose_drafter(_cfg(tiny_target), tiny_target, prefer_trained=True)
    assert choice.path == home / "drafters" / f"{tiny_target.name}-b{BLOCK}-l2"
    assert choice.how == DEFAULT_HOW


def test_serve_refuses_the_random_default_unless_allowed(home: Path, tiny_target: Path) -> None:
    """`specopd serve` (resolve_drafter): `drafter: default` with no shipped drafter is refused with the key to
    set; with allow_random_drafter: true the random-init drafter is made and served (issue 54)."""
    from sglang_specopd.app.serve.choice import DrafterInvalidError, resolve_drafter

    with pytest.raises(DrafterInvalidError, match="allow_random_drafter: true"):
        resolve_drafter(_cfg(tiny_target), tiny_target)
    random_dir = home / "drafters" / f"{tiny_target.name}-b{BLOCK}-l2"
    assert not random_dir.exists()  # nothing was made
    assert resolve_drafter(_cfg(tiny_target, allow_random_drafter=True), tiny_target) == random_dir
    assert (random_dir / "config.json").is_file()


def test_newest_trained_drafter_wins(home: Path, tiny_target: Path, tiny_drafter: Path) -> None:
    cfg = _cfg(tiny_target)
    sft = _place(tiny_drafter, _sft(home, tiny_target), 1_000_000)
    choice = choose_drafter(cfg, tiny_target, prefer_trained=True)
    assert choice.path == sft
    assert choice.how.startswith("newest trained drafter: SFT drafter of `specopd main`"), choice.how

    specopd = _place(tiny_drafter, _specopd(home), 2_000_000)
    choice = choose_drafter(cfg, tiny_target, prefer_trained=True)
    assert choice.path == specopd
    assert "drafter `specopd main` adapted to new traffic" in choice.how

    os.utime(sft / "model.safetensors", (3_000_000, 3_000_000))  # a later SFT is newer than that SpecOPD run
    assert choose_drafter(cfg, tiny_target, prefer_trained=True).path == sft


def test_trained_drafters_that_do_not_fit_are_skipped(home: Path, tiny_target: Path, tiny_drafter: Path,
                                                      tmp_path: Path) -> None:
    from sglang_specopd.wire.drafters.init import init_drafter

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

    import sglang_specopd.app.cli.demo  # noqa: F401  (registers `demo` on the app)
    import sglang_specopd.app.launch.process as launch
    from sglang_specopd.app.cli.apps import app

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
    assert f"drafter: {specopd} (newest trained drafter: drafter `specopd main` adapted to new traffic" in out, out
    assert "error: fake server: not started" in out



def test_reference_drafter_is_the_default_until_the_user_trains_one(home: Path, tiny_target: Path,
                                                                    tiny_drafter: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A shipped reference drafter: `drafter: default` serves it (serve and demo); a drafter the user trained with
    `specopd main` later beats it in the demo; one that does not fit the target, or SPECOPD_REFERENCE_DRAFTERS=off,
    falls back to the random-init default."""
    from sglang_specopd.app.drafters.reference import reference_drafter, reference_drafter_name
    from sglang_specopd.app.serve.choice import resolve_drafter

    cfg = _cfg(tiny_target)
    ref = _place(tiny_drafter, tmp_path / "reference" / reference_drafter_name(tiny_target, BLOCK), 1_000_000)
    assert ref.name == f"{tiny_target.name}-b{BLOCK}" and reference_drafter(tiny_target, BLOCK) == ref
    assert reference_drafter(tiny_target, 8) is None  # no block-8 reference ships
    for prefer in (False, True):
        choice = choose_drafter(cfg, tiny_target, prefer_trained=prefer)
        assert choice.path == ref and choice.how.startswith(f"reference drafter shipped for {tiny_target.name}")
    assert resolve_drafter(cfg, tiny_target) == ref
    assert not (home / "drafters" / f"{tiny_target.name}-b{BLOCK}-l2").exists()  # no random drafter was made

    sft = _place(tiny_drafter, _sft(home, tiny_target), 500_000)  # trained by the user: the demo prefers it
    assert choose_drafter(cfg, tiny_target, prefer_trained=True).path == sft
    assert choose_drafter(cfg, tiny_target).path == ref  # `specopd serve` keeps the reference for `default`
    shutil.rmtree(sft)

    cfg_json = ref / "config.json"  # a reference for another model under the same name: skipped
    cfg_json.write_text(cfg_json.read_text().replace('"hidden_size": 64', '"hidden_size": 96'))
    assert reference_drafter(tiny_target, BLOCK) is None
    assert choose_drafter(cfg, tiny_target, prefer_trained=True).how == DEFAULT_HOW
    monkeypatch.setenv("SPECOPD_REFERENCE_DRAFTERS", "off")
    assert reference_drafter(tiny_target, BLOCK) is None

@pytest.mark.server
def test_demo_prints_speedup_against_plain_serving_in_the_same_run(home: Path, tiny_target: Path,
                                                                    tiny_drafter: Path, tmp_path: Path) -> None:
    """Real servers (SPECOPD, then plain): the demo prints both decode rates and the speedup, and the fp32 greedy
    replies of the two servers are identical (speculative decoding is lossless)."""
    import re

    import yaml
    from typer.testing import CliRunner

    import sglang_specopd.app.cli.demo  # noqa: F401  (registers `demo` on the app)
    from sglang_specopd.app.cli.apps import app

    cfg_file = tmp_path / "demo.yaml"
    cfg_file.write_text(yaml.safe_dump(_cfg(tiny_target, max_total_tokens=4096).model_dump(exclude_defaults=True)))
    result = CliRunner().invoke(app, ["demo", "--config", str(cfg_file), "--drafter", str(tiny_drafter),
                                      "--max-tokens", "24", "--prompt", "def add(a, b):"])
    out = result.output
    assert result.exit_code == 0, out
    assert "speculative vs plain serving" in out and "plain (no drafter)" in out, out
    m = re.search(r"speedup vs plain serving: (\d+\.\d+)x \(one request at concurrency 1; replies (\w+)", out)
    assert m is not None, out
    assert float(m.group(1)) > 0 and m.group(2) == "identical", out
