"""The training progress bar shows the bound that stops the run: steps, or the time budget when it binds."""

from __future__ import annotations

import io

import pytest
import torch

from specopd_trainer.loops.progress import TrainProgress


def test_time_budget_bar_runs_over_seconds_and_ends_full() -> None:
    out = io.StringIO()
    bar = TrainProgress(desc="SFT", steps=2000, max_minutes=6.0, file=out)
    bar.update(10, 50.0, {"loss": "1.0"})  # 5 s / step: 2000 steps would take far longer than 6 minutes
    assert bar.bar.total == pytest.approx(360.0) and bar.bar.n == pytest.approx(50.0)
    bar.update(68, 363.0, {"loss": "0.5"})  # the engine stops here: past the budget
    assert bar.bar.total == pytest.approx(360.0) and bar.bar.n == pytest.approx(360.0)
    text = out.getvalue()
    bar.close()
    assert "360/360 s" in text and "step=68/2000" in text and "100%" in text
    assert "68/2000 [" not in text  # not a step bar that stops at 3%


def test_time_budget_bar_follows_the_step_bound_when_it_binds_first() -> None:
    bar = TrainProgress(desc="SFT", steps=10, max_minutes=60.0, file=io.StringIO())
    bar.update(5, 10.0, {})  # 2 s / step: 5 more steps end at 20 s, long before the hour
    assert bar.bar.total == pytest.approx(20.0) and bar.projected_end_s(5, 10.0) == pytest.approx(20.0)
    bar.update(10, 20.0, {})
    assert bar.bar.n == pytest.approx(bar.bar.total) == pytest.approx(20.0)
    bar.close()


def test_resumed_run_projects_from_this_run_only() -> None:
    bar = TrainProgress(desc="x", steps=100, start_step=50, max_minutes=10.0, wall_before=300.0, file=io.StringIO())
    assert bar.bar.n == pytest.approx(300.0)
    assert bar.projected_end_s(60, 320.0) == pytest.approx(320.0 + 40 * 2.0)  # 10 steps in 20 s this run
    bar.close()


def test_step_bar_without_budget_and_disabled_bar() -> None:
    bar = TrainProgress(desc="x", steps=40, start_step=4, file=io.StringIO())
    bar.update(7, 1.0, {"loss": "2"})
    assert bar.bar.total == 40 and bar.bar.n == 7
    bar.close()
    off = TrainProgress(desc="x", steps=40, max_minutes=1.0, enabled=False)
    off.update(3, 1.0, {})
    off.close()
    assert off.bar is None


def test_engine_draws_the_time_bar(tmp_path, capsys) -> None:
    import time

    from specopd_trainer.loops.engine import run_training

    model = torch.nn.Linear(2, 1)

    def step_fn(step, gen):
        time.sleep(0.05)
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        return float(loss.detach()), {}

    out = run_training(model, step_fn, tmp_path, steps=1000, lr=1e-3, warmup_steps=0, min_lr_ratio=0.1,
                       grad_clip=1.0, seed=0, log_every=1, ckpt_every=1000, max_minutes=0.003, progress=True)
    err = capsys.readouterr().err
    assert 0 < out["steps"] < 1000
    assert f"step={out['steps']}/1000" in err and " s [" in err and "/1000 [" not in err
