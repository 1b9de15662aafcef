"""Bootstrap intervals over prompts (specopd_trainer.intervals) on hand-checkable cases."""

from __future__ import annotations

import pytest

from specopd_trainer.intervals import acceptance_intervals, paired_difference


def _rows(domain, pairs, prefix="p"):
    return [{"id": f"{prefix}{i}", "domain": domain, "completion_tokens": c, "verify_steps": v}
            for i, (c, v) in enumerate(pairs)]


def test_point_values_are_pooled_ratios_and_the_mean_is_over_domains() -> None:
    rows = _rows("a", [(30, 10), (10, 10)]) + _rows("b", [(40, 20)]) + _rows("a", [(5, 0)], prefix="empty")
    r = acceptance_intervals(rows, ["a", "b"], n_boot=200)
    assert r["a"] == pytest.approx(2.0)  # (30 + 10) / (10 + 10); the request without verify steps is left out
    assert r["b"] == pytest.approx(2.0)
    assert r["mean"] == pytest.approx(2.0)
    assert r["prompts"] == {"a": 2, "b": 1}
    # resamples of domain a: taus 3.0 (both p0), 1.0 (both p1) or 2.0; b is constant -> mean in [1.5, 2.5]
    lo, hi = r["ci95"]
    assert 1.5 <= lo <= 2.0 <= hi <= 2.5
    assert r["ci95_by_domain"]["b"] == [pytest.approx(2.0), pytest.approx(2.0)]


def test_constant_prompts_give_a_zero_width_interval() -> None:
    rows = _rows("a", [(15, 10)] * 30)
    r = acceptance_intervals(rows, ["a"], n_boot=100)
    assert r["ci95"] == [pytest.approx(1.5), pytest.approx(1.5)]


def test_paired_difference_sees_a_small_shift_that_unpaired_noise_would_hide() -> None:
    # prompts vary a lot (tau 1.2 .. 3.0), the arm adds exactly 0.1 tau on every prompt
    base = _rows("a", [(12 + 2 * i, 10) for i in range(10)])
    arm = _rows("a", [(13 + 2 * i, 10) for i in range(10)])
    d = paired_difference(arm, base, ["a"], n_boot=300)
    assert d["mean"] == pytest.approx(0.1)
    assert d["ci95"] == [pytest.approx(0.1), pytest.approx(0.1)]
    assert d["inside_noise"] is False
    unpaired = acceptance_intervals(base, ["a"], n_boot=300)["ci95"]
    assert unpaired[1] - unpaired[0] > 0.5  # the per-arm interval is far wider than the effect


def test_paired_difference_inside_noise_and_only_common_prompts() -> None:
    base = _rows("a", [(10, 10), (30, 10), (20, 10)])
    arm = _rows("a", [(30, 10), (10, 10), (20, 10), (99, 1)])  # p3 only in the arm: ignored
    d = paired_difference(arm, base, ["a"], n_boot=500)
    assert d["prompts"] == {"a": 3}
    assert d["mean"] == pytest.approx(0.0)
    assert d["inside_noise"] is True


def test_missing_domain_raises() -> None:
    with pytest.raises(ValueError, match="no evaluated requests"):
        acceptance_intervals(_rows("a", [(1, 1)]), ["a", "b"])
    with pytest.raises(ValueError, match="no prompts evaluated by both"):
        paired_difference(_rows("a", [(1, 1)]), _rows("a", [(1, 1)], prefix="q"), ["a"])
