"""sglang_specopd.app.traffic_load: the prompt orders the main job and the shift benchmark send."""

from __future__ import annotations

import pytest

from sglang_specopd.app.traffic_load import blend, mixed


def _recs(domain, n):
    return [{"domain": domain, "i": i} for i in range(n)]


def test_mixed_interleaves_domains_round_robin_and_restarts_the_smaller():
    out = mixed(_recs("b", 2) + _recs("a", 3), seed=0)
    assert [r["domain"] for r in out] == ["a", "b", "a", "b", "a", "b"]
    assert sorted(r["i"] for r in out if r["domain"] == "a") == [0, 1, 2]
    assert [r["i"] for r in out if r["domain"] == "b"][2] == [r["i"] for r in out if r["domain"] == "b"][0]


def test_blend_puts_old_records_at_the_share_spread_evenly_in_order():
    new, old = _recs("new", 6), _recs("old", 5)
    out = blend(new, old, 0.25)
    # 6 new / (1 - 0.25) = 8 items; item i is old when floor((i+1)/4) > floor(i/4): i = 3 and 7
    assert [r["domain"] for r in out] == ["new"] * 3 + ["old"] + ["new"] * 3 + ["old"]
    assert [r["i"] for r in out if r["domain"] == "new"] == [0, 1, 2, 3, 4, 5]
    assert [r["i"] for r in out if r["domain"] == "old"] == [0, 1]
    assert blend(new, [], 0.0) == new


def test_blend_cycles_a_short_old_list_and_refuses_bad_shares():
    out = blend(_recs("new", 9), _recs("old", 1), 0.5)
    assert len(out) == 18 and sum(r["domain"] == "old" for r in out) == 9
    assert {r["i"] for r in out if r["domain"] == "old"} == {0}
    for share in (-0.1, 1.0):
        with pytest.raises(ValueError, match="old_share"):
            blend(_recs("new", 2), _recs("old", 2), share)
    with pytest.raises(ValueError, match="needs new records"):
        blend(_recs("new", 2), [], 0.3)
