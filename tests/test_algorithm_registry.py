"""The training-algorithm registry and the ``specopd train <algorithm>`` commands generated from it (no server).

A throw-away algorithm registered here (and nowhere else) shows up in ``specopd train --help`` and runs through
CliRunner with options derived from its config (recipe defaults, flags, bool and Literal options), a faked server
session and faked prompts. Option errors of ``specopd train *`` and ``specopd main`` are one ``error:`` line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

import pytest
from pydantic import BaseModel, ConfigDict, Field

from fakes.cli import one_error_line
from fakes.cli import specopd_cli as cli
from specopd_trainer.algorithms import registry
from specopd_trainer.algorithms.registry import Algorithm, RunReport, TrainContext

SEEN: dict = {}


class DummyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(default=5, ge=1, description="Total optimiser steps.")
    max_minutes: Optional[float] = Field(default=None, gt=0, description="Time budget.")
    greeting: str = Field(default="hello", description="What to say.")
    scale: float = Field(default=1.0, gt=0, description="A positive scale: used by nothing.")
    loud: bool = Field(default=False, description="Say it loudly.")
    mode: Literal["a", "b"] = Field(default="a", description="One of two modes.")
    hidden_knob: int = Field(default=7, description="Not a CLI option.")


def dummy_run(ctx: TrainContext, cfg: DummyConfig) -> RunReport:
    SEEN.update(ctx=ctx, cfg=cfg)
    ctx.push(cfg.steps, ctx.drafter)
    return RunReport({"steps": cfg.steps}, (("greeting", cfg.greeting.upper() if cfg.loud else cfg.greeting),
                                            ("scale", registry.fmt(cfg.scale, 2))))


DUMMY = Algorithm(name="dummy-algo", title="Dummy", help="A throw-away algorithm of the tests.\n\nMore help.",
                  config=DummyConfig, run=dummy_run, recipe={"scale": 2.5}, data="prompts",
                  flags={"greeting": "--say"}, hidden=("hidden_knob",), version_prefix="dum")


@pytest.fixture()
def dummy():
    registry.register(DUMMY)
    SEEN.clear()
    yield DUMMY
    registry.unregister(DUMMY.name)


class FakeDrafter:
    def save_pretrained(self, out: Path, overwrite: bool = False) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.safetensors").write_text("x")
        return out


class FakeSession:
    """Stands in for :class:`sglang_specopd.app.train.session._Session` (no server)."""

    def __init__(self, server, api_key, admin_key, init, target, *, need_push, say):
        self.url = self.where = server
        self.init, self.target, self.client = "INIT", "TARGET", object()
        self.push_enabled = admin_key is not None
        SEEN["need_push"] = need_push

    def load_drafter(self, device="cpu", dtype=None):
        SEEN["load"] = (device, dtype)
        return FakeDrafter()

    def pusher(self, prefix, versions):
        def push(step, drafter):
            versions.append(f"{prefix}-step{step}")

        return push if self.push_enabled else None

    def finish_pushes(self, drafter, versions):
        SEEN["finished_pushes"] = list(versions)

    def serving_version(self):
        return "served"


@pytest.fixture()
def no_server(monkeypatch):
    import sglang_specopd.app.train.fleet_session as fs
    import sglang_specopd.app.train.data as td

    # the session factory is replaced, never train_session._Session itself: FleetSession subclasses that class when
    # fleet_session is first imported, and a fake base class would stay in it for the rest of the process
    monkeypatch.setattr(fs, "open_session",
                        lambda ends, *a, **kw: FakeSession(ends.server or ",".join(ends.workers), *a, **kw))
    monkeypatch.setattr(td, "_load_prompts", lambda sess, data, *, per_domain, max_prompt_tokens: [[1, 2], [3]])


def test_builtin_algorithms_are_registered_with_light_imports() -> None:
    import subprocess
    import sys

    assert registry.names()[:4] == ["specopd", "sft", "sequential-opd", "draft-opd"]
    code = ("import sys; from specopd_trainer.algorithms import registry; registry.names(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr  # `specopd train --help` does not load torch


def test_registry_rejects_bad_entries(dummy) -> None:
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Algorithm(name="dummy-algo", title="x", help="x", config=DummyConfig, run=dummy_run))
    with pytest.raises(ValueError, match="not fields of DummyConfig"):
        Algorithm(name="bad", title="x", help="x", config=DummyConfig, run=dummy_run, recipe={"nope": 1})
    with pytest.raises(registry.UnknownAlgorithmError, match="registered: specopd, sft, sequential-opd, draft-opd, dummy-algo"):
        registry.get("nope")
    assert dummy.make_config(steps=3) == DummyConfig(steps=3, scale=2.5)


def test_dummy_algorithm_is_listed_and_runs_through_the_cli(dummy, no_server, tmp_path: Path) -> None:
    res = cli("train", "--help")
    assert res.exit_code == 0 and "dummy-algo" in res.stdout and "A throw-away algorithm of the tests." in res.stdout
    res = cli("train", "dummy-algo", "--help")
    assert res.exit_code == 0
    for flag in ("--say", "--scale", "--loud", "--mode", "--steps", "--server", "--max-prompt-tokens"):
        assert flag in res.stdout, flag
    assert "--hidden-knob" not in res.stdout and "--max-new-tokens" not in res.stdout

    run = tmp_path / "run"
    res = cli("train", "dummy-algo", "--server", "http://fake", "--admin-key", "k", "--data", "math", "--run-dir",
              str(run), "--say", "hi", "--loud", "--mode", "b", "--steps", "3", "--no-progress")
    assert res.exit_code == 0, res.output
    assert SEEN["cfg"] == DummyConfig(steps=3, greeting="hi", scale=2.5, loud=True, mode="b")  # scale: the recipe
    ctx = SEEN["ctx"]
    assert ctx.prompts == [[1, 2], [3]] and ctx.run_dir == run and ctx.progress is False and SEEN["need_push"] is False
    assert "HI" in res.stdout and "2.50" in res.stdout and "dum-run-step3" in res.stdout
    assert "starting Dummy in" in res.stderr and "2 prompts" in res.stderr
    recorded = json.loads((run / "run_config.json").read_text())
    assert recorded["method"] == "dummy-algo" and recorded["greeting"] == "hi" and recorded["hidden_knob"] == 7


def test_device_and_dtype_reach_the_drafter(dummy, no_server, tmp_path: Path, monkeypatch) -> None:
    """Issue 54: ``--device`` / ``--dtype`` of every train command and ``specopd adapt`` (default cuda when
    available, bf16 on cuda, float32 on cpu); ``--device cuda`` without CUDA is one error line, exit 2."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    base = ["train", "dummy-algo", "--server", "http://fake", "--admin-key", "k", "--data", "math", "--no-progress"]
    for extra, want in (([], ("cpu", torch.float32)), (["--device", "cpu", "--dtype", "bfloat16"],
                                                       ("cpu", torch.bfloat16)), (["--dtype", "fp16"],
                                                                                  ("cpu", torch.float16))):
        res = cli(*base, "--run-dir", str(tmp_path / f"r{len(SEEN)}"), *extra)
        assert res.exit_code == 0, res.output
        assert SEEN["load"] == want
    line = one_error_line(cli(*base, "--device", "cuda"))
    assert "--device cuda: no CUDA device is available here" in line and "--device cpu" in line
    assert "bad option --dtype: 'int8'" in one_error_line(cli(*base, "--dtype", "int8"))
    assert "no CUDA device" in one_error_line(cli("adapt", "--server", "http://fake", "--admin-key", "k",
                                                  "--device", "cuda"))
    from sglang_specopd.app.train.options import resolve_device_dtype

    assert resolve_device_dtype(None, None, cuda_available=True) == ("cuda", torch.bfloat16)
    assert resolve_device_dtype("cuda:1", "float32", cuda_available=True) == ("cuda:1", torch.float32)


def test_the_session_loads_drafter_and_target_head_on_the_device_in_the_dtype(tiny_drafter, tiny_target) -> None:
    import torch

    from sglang_specopd.app.train.session import _Session

    sess = object.__new__(_Session)  # no server: only what load_drafter reads
    sess.init, sess.target, sess.push_enabled = tiny_drafter, tiny_target, False
    for dtype in (torch.bfloat16, torch.float32):
        drafter = sess.load_drafter("cpu", dtype)
        assert {p.dtype for p in drafter.parameters()} == {dtype}
        assert {p.device.type for p in drafter.parameters()} == {"cpu"}
        head = drafter.target_head
        assert head.embed.dtype == head.lm_head.dtype == dtype and head.lm_head.device.type == "cpu"


def test_specopd_command_defaults_are_the_validated_recipe(monkeypatch) -> None:
    import sglang_specopd.app.train.commands as tc

    got = {}
    monkeypatch.setattr(tc, "run_algorithm", lambda alg, *, options, **shared: got.update(options=options,
                                                                                         **shared))
    res = cli("train", "specopd", "--server", "http://fake")
    assert res.exit_code == 0, res.output
    cfg = registry.get("specopd").make_config(**got["options"])
    assert (cfg.loss, cfg.anchors_per_seq, cfg.branches, cfg.root_anchors_per_seq, cfg.seqs_per_step, cfg.lr,
            cfg.push_every, cfg.steps) == ("e2e_fkl_is", 8, 7, 64, 2, 1e-3, 32, 256)
    assert cfg == registry.get("specopd").make_config()
    assert got["run_dir"] == Path("runs/specopd") and got["max_new_tokens"] == 160


@pytest.mark.parametrize("args, needle", [
    (["train", "dummy-algo", "--server", "http://fake", "--scale", "-1"], "bad option --scale: Input should be greater than 0"),
    (["train", "dummy-algo"], "name the server(s) once: --server URL"),
    (["train", "dummy-algo", "--server", "http://fake", "--steps", "many"], "'--steps'"),
    (["train", "dummy-algo", "--server", "http://fake", "--mode", "c"], "'--mode'"),
    (["train", "no-such-algo"], "No such command 'no-such-algo'"),
    (["train", "specopd", "--server", "http://fake", "--loss", "nope"], "unknown SpecOPD loss 'nope'"),
    (["train", "specopd", "--server", "http://fake", "--loss", "e2e_tv"], "--root-anchors"),
    (["main", "--eval-new", "0"], "bad option --eval-new: Input should be greater than or equal to 1"),
    (["main", "--traffic-minutes", "0"], "bad option --traffic-minutes"),
    (["main", "--old-share", "1"], "bad option --old-share: Input should be less than 1"),
    (["main", "--eval-old", "x"], "'--eval-old'"),
])
def test_option_errors_are_one_line(dummy, no_server, args, needle) -> None:
    line = one_error_line(cli(*args))
    assert needle in line, line


def test_main_job_lines_read_the_intervals_and_never_call_the_start_redeployed() -> None:
    from sglang_specopd.app.main_job.run import MainJobConfig
    from sglang_specopd.app.main_job.report import change_line, deployed_line, format_timings
    from specopd_trainer.intervals import paired_difference

    assert format_timings({"server_start_s": 45.4, "eval_before_s": 95.0}) == "server_start 45 s, eval_before 95 s"
    with pytest.raises(ValueError):
        MainJobConfig(traffic_minutes=0)
    # 2 prompts per domain (completion tokens / verify steps) 12/8 and 10/10 before, 16/8 and 10/10 after: a domain's
    # tau pools its requests, 22/18 -> 26/18, so the change is +4/18 in each domain and in their mean
    domains = ["a", "b"]
    before = [{"id": f"{d}{i}", "domain": d, "completion_tokens": c, "verify_steps": v}
              for d in domains for i, (c, v) in enumerate([(12, 8), (10, 10)])]
    after = [{**r, "completion_tokens": 16} if r["id"].endswith("0") else r for r in before]
    change = paired_difference(after, before, domains)
    assert change["mean"] == pytest.approx(4 / 18)
    line = change_line("new domains", change)
    assert line.startswith("new domains (a, b): +0.222 [") and "over 4 prompts" in line
    assert line.endswith("inside the noise" if change["inside_noise"] else "a gain")
    kept = {"deployed": "start", "serving_version": "initial", "reason": "no candidate measured better"}
    assert deployed_line(kept).startswith("deployed: still the shipped drafter (version 'initial')")
    assert "redeployed" not in deployed_line(kept)
    took = {"deployed": "adapted", "serving_version": "adapt-x-2", "reason": "candidate interval [+0.1, +0.3]"}
    assert deployed_line(took) == "deployed: the adapted drafter, version 'adapt-x-2': candidate interval [+0.1, +0.3]"

