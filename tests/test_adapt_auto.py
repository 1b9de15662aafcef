"""``specopd adapt --algorithm auto``: the flattening rule and the table (hand-checked), and the switch in the loop
against the fake traffic server (SFT until the gain flattens, then the table's choice, shown in the progress line
and kept in the summary and across a resume)."""

from __future__ import annotations

import pytest

from _sft_fixture import tiny_drafter
from fakes.adapt import FakeSpool
from fakes.adapt import run_ids as _run_ids


def _v(diff, ran=True, kind="candidate"):
    return {"kind": kind, "ran": ran, "diff": diff, "deploy": False}


def test_flattened_needs_k_ran_candidate_verdicts_all_below_the_threshold():
    from specopd_trainer.adapt.auto import flattened

    assert not flattened([_v(0.01), _v(0.0)], 3, 0.02)  # only two
    assert flattened([_v(0.5), _v(0.01), _v(-0.1), _v(0.019)], 3, 0.02)  # the last three: 0.01, -0.1, 0.019
    assert not flattened([_v(0.01), _v(0.03), _v(0.0)], 3, 0.02)  # 0.03 is not flat
    # a verdict that could not run, a rollback check or a reset do not count
    assert not flattened([_v(0.0), _v(None, ran=False), _v(0.0, kind="deployed_vs_previous"), _v(0.0)], 3, 0.02)
    assert flattened([_v(0.0), _v(None, ran=False), _v(0.0), _v(0.0)], 3, 0.02)


def test_the_table_keeps_sft_everywhere_until_a_win_is_measured_and_says_so():
    from specopd_trainer.adapt.auto import AUTO_TABLE, Choice, choose, temperature_key

    assert temperature_key(0.0) == "T0" and temperature_key(0.7) == "T1" and temperature_key(1.0) == "T1"
    assert len(AUTO_TABLE) == 6
    for arch in ("dflash", "dflash2", "dspark"):
        for t in (0.0, 1.0):
            c = choose(arch, t)
            assert c.algorithm == "sft" and "opd_regimes_smollm2_cpu.json" in c.evidence
    assert choose("unknown-arch", 0.0).algorithm == "sft"
    table = {("dspark", "T1"): Choice("draft-opd", "opd_regimes: +0.12 [+0.03, +0.2]")}
    assert choose("dspark", 1.0, table).algorithm == "draft-opd" and choose("dspark", 0.0, table).algorithm == "sft"


def test_advance_switches_once_and_records_the_choice():
    from specopd_trainer.adapt.auto import Choice, advance, describe, new_schedule

    table = {("dflash", "T1"): Choice("specopd", "measured")}
    s = new_schedule()
    assert describe(s) == "auto: sft until the held-out gain flattens"
    assert advance(s, [_v(0.1)] * 3, k=3, threshold=0.02, arch="dflash", temperature=1.0, step=40, table=table) is None
    assert s["phase"] == "sft"
    assert advance(s, [_v(0.0)] * 3, k=3, threshold=0.02, arch="dflash", temperature=1.0, step=80,
                   table=table) == "specopd"
    assert s["algorithm"] == "specopd" and s["switched_at_step"] == 80
    assert describe(s) == "auto: sft -> specopd at step 80 (measured)"
    assert advance(s, [_v(0.0)] * 3, k=3, threshold=0.02, arch="dflash", temperature=1.0, step=120,
                   table=table) is None and s["switched_at_step"] == 80  # once
    kept = new_schedule()
    assert advance(kept, [_v(0.0)] * 3, k=3, threshold=0.02, arch="dflash", temperature=0.0, step=80) is None
    assert kept["phase"] == "chosen" and kept["algorithm"] == "sft" and "sft kept" in describe(kept)


class _Pushes:
    def __init__(self, spool):
        self.spool, self.versions = spool, []

    def __call__(self, drafter, version):
        self.versions.append(version)
        self.spool.version = version


def _adapter(run_dir, sp, **over):
    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.adapt.loop import Adapter

    cfg = AdaptConfig(**{"min_holdout": 4, "holdout_window": 4, "eval_every": 5, "min_train_tokens": 64, "lr": 1e-2,
                         "warmup_steps": 2, "poll_s": 0.01, "ckpt_every": 5, "max_steps": 30, "retain": 0.0,
                         "rehearsal": 0.25, "auto_flat_verdicts": 2, "auto_flat_gain": 10.0,  # every gain is flat
                         "algorithm_options": {"seqs_per_step": 2, "anchors_per_seq": 4}, **over})
    return Adapter(sp, tiny_drafter(seed=0), run_dir, cfg, push=_Pushes(sp), serving_version=lambda: sp.version,
                   progress=False, sleep=lambda s: None)


def _spool():
    sp = FakeSpool()
    for seq in range(1, 33):
        sp.add(seq, _run_ids(seq, 40), 8)
    return sp


def test_auto_is_the_default_and_switches_to_the_tables_choice_after_the_gain_flattens(tmp_path, monkeypatch):
    from specopd_trainer.adapt import auto
    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.algorithms import registry

    assert AdaptConfig().algorithm == "auto"
    monkeypatch.setitem(auto.AUTO_TABLE, ("dflash", "T0"), auto.Choice("specopd", "test entry"))
    made = []
    real_get = registry.get

    def get(name):  # record which adapt steps are built; specopd's step trains SFT here (no scoring server)
        alg = real_get(name)
        if name != "specopd":
            return alg
        sft = real_get("sft")

        class Alg:
            adapt = staticmethod(lambda ctx, cfg: (made.append(("specopd", ctx.retain)), sft.adapt(ctx, cfg))[1])

            @staticmethod
            def make_config(**kw):
                made.append(("options", kw))
                return sft.make_config(seqs_per_step=2, anchors_per_seq=4)
        return Alg

    monkeypatch.setattr(registry, "get", get)
    sp = _spool()
    ad = _adapter(tmp_path / "run", sp, auto_options={"specopd": {"lr_hint": 1}})
    assert ad.algorithm == "sft" and ad.state.schedule["phase"] == "sft"
    out = ad.run()
    sched = out["schedule"]
    assert sched["phase"] == "chosen" and sched["choice"] == "specopd" and sched["algorithm"] == "specopd"
    assert sched["switched_at_step"] == 10  # judged at 5 and 10: two flat verdicts
    assert ("options", {"lr_hint": 1}) in made and ("specopd", 0.0) in made  # its options, the same retention
    assert any(v["kind"] == "schedule" and v["choice"] == "specopd" for v in out["verdicts"])
    assert "auto: sft -> specopd at step 10 (test entry)" in auto.describe(sched)
    resumed = _adapter(tmp_path / "run", sp, max_steps=31)  # the checkpoint keeps the phase
    assert resumed.algorithm == "specopd" and resumed.state.schedule["switched_at_step"] == 10


def test_auto_keeps_sft_where_the_table_has_no_win(tmp_path):
    ad = _adapter(tmp_path / "run", _spool(), max_steps=10)
    out = ad.run()
    assert out["schedule"]["phase"] == "chosen" and out["schedule"]["algorithm"] == "sft"
    assert "no measured OPD win" in out["schedule"]["evidence"] and ad.algorithm == "sft"


def test_a_fixed_algorithm_has_no_schedule(tmp_path):
    ad = _adapter(tmp_path / "run", _spool(), algorithm="sft", max_steps=5)
    assert ad.run()["schedule"] == {} and ad.algorithm == "sft"


def test_auto_refuses_nothing_but_an_unknown_algorithm(tmp_path):
    from specopd_trainer.algorithms.registry import UnknownAlgorithmError

    with pytest.raises(UnknownAlgorithmError):
        _adapter(tmp_path / "run", _spool(), algorithm="no-such")
