"""The main job's closing speed measurement (issue 53, :mod:`sglang_specopd.app.main_job.speed`): the summary's
tokens/s and paired ratios by hand, and the ratio helper it shares with benchmarks/goodput (its server run is in
tests/test_goodput_server.py)."""

from __future__ import annotations

import pytest

from sglang_specopd.app.main_job.report import speed_line
from sglang_specopd.app.main_job.speed import forced_plain, speed_summary


def _rows(latencies, tokens=10, domains=("japanese", "wordsort"), ok=None):
    return [{"id": f"p{i}", "domain": domains[i % len(domains)], "ok": True if ok is None else ok[i],
             "completion_tokens": tokens, "latency_s": lat} for i, lat in enumerate(latencies)]


def test_speed_summary_hand_values_and_ratios():
    rows = {"plain": _rows([1.0, 1.0, 2.0, 2.0]), "start": _rows([0.8, 0.8, 1.6, 1.6]),
            "adapted": _rows([0.5, 0.5, 1.0, 1.0])}
    got = speed_summary(rows, ["japanese", "wordsort"])
    assert got["plain"] == pytest.approx(40 / 6, abs=0.01)     # 4 x 10 tokens / 6 s
    assert got["start"] == pytest.approx(40 / 4.8, abs=0.01)
    assert got["adapted"] == pytest.approx(40 / 3.0, abs=0.01)
    r = got["ratios"]
    assert r["adapted_over_plain"]["mean"] == pytest.approx(2.0)
    assert r["adapted_over_plain"]["ci95"] == pytest.approx([2.0, 2.0])  # the same ratio on every prompt
    assert r["start_over_plain"]["mean"] == pytest.approx(1.25)
    assert r["adapted_over_start"]["mean"] == pytest.approx(1.6)
    assert set(got["by_domain"]) == {"japanese", "wordsort"}
    assert got["by_domain"]["wordsort"]["plain"] == pytest.approx(20 / 3, abs=0.01)  # p1 (1 s) + p3 (2 s)
    assert got["by_domain"]["wordsort"]["adapted_over_plain"]["prompts"] == 2
    assert got["prompts"] == 4
    assert "adapted / plain 2.00x [2.00, 2.00] over 4 prompts" in speed_line(got)


def test_speed_summary_pairs_by_prompt_and_reuses_start_when_nothing_was_deployed():
    rows = {"plain": _rows([1.0, 1.0, 1.0], ok=[True, True, False]), "start": _rows([0.5, 2.0, 0.1])}
    got = speed_summary(rows, ["japanese", "wordsort"])
    assert got["prompts"] == 2                     # p2 failed on plain: left out of every arm
    assert got["start"] == got["adapted"] == pytest.approx(20 / 2.5, abs=0.01)
    assert got["ratios"]["adapted_over_start"]["mean"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="every arm"):
        speed_summary({"plain": _rows([1.0], ok=[False]), "start": _rows([1.0])}, ["japanese"])
    assert speed_line(None).startswith("speed: not measured")


def test_forced_plain_makes_k0_cheapest_for_every_draft_count():
    s = forced_plain(7)
    curve = s["cost_curve_ms"][1]
    assert len(curve) == 8 and curve[0] < min(curve[1:]) and s["plain_k0"] and s["explore_every"] == 0
