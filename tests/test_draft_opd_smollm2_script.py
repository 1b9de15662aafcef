"""benchmarks/draft_opd_compare/run.py and its draft_opd_compare/ helpers: arm selection, budget accounting per arm, the
budget stop of the rollout arms, per-arm results kept and merged, tau intervals and paired differences on synthetic
per-request rows (values checked by hand), the plot, one-line CLI errors; and one short end-to-end run of two arms
on the tiny target (marked ``server``)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from _scripts import load_benchmark, tiny_specopd_config

from sglang_specopd.app.results import portable

MOD = load_benchmark("draft_opd_compare")  # puts benchmarks/ on sys.path: the helper package below

from draft_opd_compare import arms, store, train  # noqa: E402

DOMAINS = ["a", "b"]


def rows(per_domain):
    """per_request rows: {domain: [(completion_tokens, verify_steps), ...]} -> ids d0, d1, ..."""
    return [{"id": f"{d}{i}", "domain": d, "completion_tokens": c, "verify_steps": v}
            for d, xs in per_domain.items() for i, (c, v) in enumerate(xs)]


def test_select_arms():
    assert arms.select_arms(None) == list(arms.ARMS) == arms.select_arms("all") == arms.select_arms(" ")
    assert arms.select_arms("draft_opd, sft_start,draft_opd") == ["sft_start", "draft_opd"]  # ARMS order, once
    assert len(arms.ARMS) == 10 and arms.ARMS[:2] == ("sft_start", "sft_continued")
    with pytest.raises(arms.ArmsError, match="unknown dopd; valid: sft_start, sft_continued"):
        arms.select_arms("draft_opd,dopd")
    with pytest.raises(arms.ArmsError, match="none given"):
        arms.select_arms(",")


def test_budget_accounting_per_arm():
    g, budget = 7, 229376
    # continued SFT: 8 x 16 x 7 = 896 labelled slots per step -> 256 steps, exactly the budget
    from specopd_smollm2.run import continued_sft_config

    cfg, tokens = continued_sft_config(budget, g, 1e-3)
    assert (cfg.steps, tokens) == (256, budget)
    # SpecOPD recipe: 2 x (8 x 7 x 7 + 64) = 912 per step -> round(251.5) = 252 steps
    s = arms.specopd_recipe_config(budget, g)
    assert (s.seqs_per_step, s.anchors_per_seq, s.branches, s.root_anchors_per_seq) == (2, 8, 7, 64)
    assert s.loss == "e2e_fkl_is" and s.lr == 1e-3 and s.steps == 252
    # Draft-OPD: 256 blocks x 7 slots = 1792 per full step -> ceil(128.0) = 128; one token more -> 129
    assert arms.draft_opd_steps(budget, g, 256) == 128 and arms.draft_opd_steps(budget + 1, g, 256) == 129
    assert arms.draft_opd_steps(1, g, 256) == 1
    # sequential: 16 x 64 / 1.2 x 7 = 5973.3 per step -> round(38.4) = 38
    assert arms.sequential_steps(budget, g, 16, 64) == 38 and arms.sequential_steps(1, g, 16, 64) == 1
    q = arms.sequential_config(budget, g, rollout_prompts=16, rollout_tokens=64, lr=3e-4)
    assert (q.steps, q.concurrency, q.temperature, q.lr) == (38, 16, 1.0, 3e-4)
    assert arms.budget_fraction(230000, budget) == pytest.approx(230000 / budget)


def test_draft_opd_arms_use_the_ablation_flags():
    mk = lambda a: arms.draft_opd_config(a, 1792 * 3, 7, rollout_prompts=4, rollout_tokens=32,  # noqa: E731
                                         max_blocks=256, lr=1e-4)
    base = mk("draft_opd")
    assert (base.steps, base.push_every, base.replay, base.loss, base.anchors) == (3, 1, True, "mixed", "error")
    assert (base.rollout_prompts, base.concurrency, base.rollout_tokens, base.lr) == (4, 4, 32, 1e-4)
    assert mk("draft_opd_no_replay").replay is False and mk("draft_opd_fkl_only").loss == "fkl_only"
    assert mk("draft_opd_rkl_only").loss == "rkl_only" and mk("draft_opd_random_anchors").anchors == "random"
    assert mk("draft_opd_first_rejection").rejected_slots == "first" and base.rejected_slots == "all"
    for a in arms.DRAFT_OPD_ARMS:  # every ablation differs from the method in exactly one field
        diff = {k for k, v in mk(a).model_dump().items() if v != base.model_dump()[k]}
        assert len(diff) == (0 if a == "draft_opd" else 1), (a, diff)
    with pytest.raises(KeyError):
        mk("specopd")


def _session(tmp_path, budget, **args):
    return train.Session(url="http://x", admin_key="k", client=SimpleNamespace(prefix_cache=lambda clear: {}),
                         tok=None, base=None, train_seqs=[], prompts=[[1, 2]], budget_tokens=budget,
                         args=SimpleNamespace(**args), run_dir=tmp_path, log=lambda m: None)


def fake_rollout_loop(per_step):
    """A rollout loop like train_draft_opd / train_sequential_opd: resumes from its counters, pushes before every
    step and once at the end, counts ``per_step`` supervised tokens per step (an int, or a function of the
    step), a metrics row per step."""
    rate = per_step if callable(per_step) else (lambda step: per_step)

    def loop(drafter, client, prompts, run_dir, cfg, *, push, progress):
        run_dir.mkdir(parents=True, exist_ok=True)
        start = max((int(k) for k in json.loads((run_dir / "counters.json").read_text())), default=0) \
            if (run_dir / "counters.json").is_file() else 0
        tokens = train.counted_tokens(run_dir)
        for step in range(start, cfg.steps):
            push(step, drafter)
            tokens += rate(step)
            (run_dir / "counters.json").write_text(json.dumps({str(step + 1): {
                "supervised_tokens": tokens, "wall_s": 1.0}}))
            with open(run_dir / "metrics.jsonl", "a") as fh:
                fh.write("{}\n")
        push(cfg.steps, drafter)
        return {"steps": cfg.steps}

    return loop


@pytest.fixture
def pushed(monkeypatch):
    import specopd_trainer.pipeline as pipeline

    out = []
    monkeypatch.setattr(pipeline, "push_drafter", lambda url, d, version, key: out.append((url, version, key)))
    return out


@pytest.mark.parametrize("arm,module,fn", [
    ("draft_opd_rkl_only", "specopd_trainer.algorithms.draft_opd.loop", "train_draft_opd"),
    ("sequential_opd", "specopd_trainer.algorithms.sequential_opd.loop", "train_sequential_opd")])
def test_budget_push_stops_a_rollout_arm_between_steps(tmp_path: Path, monkeypatch, pushed, arm, module, fn):
    """1000 tokens per step, a 2500-token budget: the third step brings it to 3000 and the fourth step's push
    stops the run (its own step count is 105 / 26)."""
    import importlib

    monkeypatch.setattr(importlib.import_module(module), fn, fake_rollout_loop(1000))
    s = _session(tmp_path, 2500, rollout_prompts=4, rollout_tokens=16, max_blocks=8, lr_opd=1e-4)
    s.start_tau = 2.0
    out = train._train(s, arm, SimpleNamespace(block_size=4), tmp_path / "dopd")
    assert out["stopped_at_budget"] is True and out["steps"] == 3 and out["supervised_tokens"] == 3000
    assert out["topups"] == 0
    assert [v for _, v, _ in pushed] == [f"{arm}-step0", f"{arm}-step1", f"{arm}-step2"]
    assert pushed[0][0] == "http://x" and pushed[0][2] == "k"
    if arm == "sequential_opd":  # steps from the start's tau: round(2500 / (4 x 16 / 2 x 3)) = round(26.04)
        assert out["config"]["steps"] == 26 and out["tau_assumed"] == 2.0
    else:
        assert out["config"]["loss"] == "rkl_only" and out["config"]["steps"] == arms.draft_opd_steps(2500, 3, 8)
        assert out["config"]["steps"] == 105
    assert train.counted_tokens(tmp_path / "nothing") == 0


def test_a_rollout_arm_below_its_budget_is_topped_up(tmp_path: Path, monkeypatch, pushed):
    """Sequential arm planned at 26 steps (tau 2) but supervising 50 tokens per step: 1300 after 26 steps, so
    it resumes for ceil(1200 / 50) = 24 more steps, reaches 2500 at step 50 and the final push stops it."""
    import specopd_trainer.algorithms.sequential_opd.loop as sloop

    monkeypatch.setattr(sloop, "train_sequential_opd", fake_rollout_loop(50))
    s = _session(tmp_path, 2500, rollout_prompts=4, rollout_tokens=16, max_blocks=8, lr_opd=1e-4)
    s.start_tau = 2.0
    out = train._train(s, "sequential_opd", SimpleNamespace(block_size=4), tmp_path / "seq")
    assert (out["topups"], out["steps"], out["supervised_tokens"], out["config"]["steps"]) == (1, 50, 2500, 50)
    assert out["stopped_at_budget"] is True
    assert [v for _, v, _ in pushed][25:28] == ["sequential_opd-step25", "sequential_opd-step26",
                                                "sequential_opd-step26"]  # end of round 1, start of the top-up
    # no tokens after step 26: MAX_TOPUPS resumptions of at most the planned 26 steps each, then the arm reports
    # what it supervised
    monkeypatch.setattr(sloop, "train_sequential_opd", fake_rollout_loop(lambda step: 10 if step < 26 else 0))
    out = train._train(s, "sequential_opd", SimpleNamespace(block_size=4), tmp_path / "seq2")
    assert out["topups"] == train.MAX_TOPUPS == 3 and out["stopped_at_budget"] is False
    assert out["supervised_tokens"] == 260 and out["steps"] == 26 * 4


def test_an_equal_steps_arm_runs_draft_opds_steps_without_budget_stop_or_topups(tmp_path: Path, monkeypatch,
                                                                                pushed):
    """draft_opd_first_rejection at 100 tokens per step and a 240-token budget runs draft_opd's planned
    ceil(240 / (8 blocks x 3 slots)) = 10 steps (1000 tokens): no stop when the budget is reached after 3 steps,
    no top-up."""
    import specopd_trainer.algorithms.draft_opd.loop as dloop

    monkeypatch.setattr(dloop, "train_draft_opd", fake_rollout_loop(100))
    s = _session(tmp_path, 240, rollout_prompts=4, rollout_tokens=16, max_blocks=8, lr_opd=1e-4)
    out = train._train(s, "draft_opd_first_rejection", SimpleNamespace(block_size=4), tmp_path / "first")
    assert arms.EQUAL_STEPS_ARMS["draft_opd_first_rejection"] == "draft_opd"
    assert (out["steps"], out["supervised_tokens"], out["topups"]) == (10, 1000, 0)
    assert out["stopped_at_budget"] is False and out["steps_of"] == "draft_opd"
    assert out["config"]["steps"] == arms.draft_opd_steps(240, 3, 8) == 10
    assert out["config"]["rejected_slots"] == "first" and len(pushed) == 11  # a push per step and the final one
    # the same budget stops draft_opd itself after 3 steps
    out = train._train(s, "draft_opd", SimpleNamespace(block_size=4), tmp_path / "method")
    assert out["stopped_at_budget"] is True and out["steps"] == 3 and "steps_of" not in out


def test_ticker_logs_the_last_metrics_row(tmp_path: Path):
    import time

    logs = []
    s = _session(tmp_path, 100)
    s.log = logs.append
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 3, "supervised_tokens": 42, "loss": 0.5}) + "\n")
    with train.ticker(s, "draft_opd", tmp_path, every_s=0.02):
        time.sleep(0.15)
    assert logs and all("step 3, supervised tokens 42 / 100, loss 0.5" in m and m.startswith("[draft_opd]")
                        for m in logs)


def test_pooled_tau():
    assert train.pooled_tau(rows({"a": [(10, 5), (6, 3)], "b": [(9, 3)]})) == pytest.approx(25 / 11)
    assert train.pooled_tau(rows({"a": [(1, 0)]})) is None


def test_setup_and_per_arm_results_are_kept(tmp_path: Path):
    setup = {"start_sha256": "ab", "budget_tokens": 10}
    store.check_setup(tmp_path, setup)
    store.check_setup(tmp_path, dict(setup))  # same settings: fine
    with pytest.raises(store.SetupMismatchError, match=r"\(budget_tokens\)"):
        store.check_setup(tmp_path, {**setup, "budget_tokens": 11})
    assert store.finished_arms(tmp_path) == {}
    store.save_arm(tmp_path, "draft_opd", {"supervised_tokens": 5})
    store.save_arm(tmp_path, "sft_start", {"supervised_tokens": 0})
    (tmp_path / "arms" / "unknown_arm.json").write_text("{}")  # not an arm: ignored
    done = store.finished_arms(tmp_path)
    assert list(done) == ["sft_start", "draft_opd"] and done["draft_opd"] == {"arm": "draft_opd",
                                                                              "supervised_tokens": 5}
    assert store.missing_arms(["sft_start", "specopd"], done) == ["specopd"]
    assert not list((tmp_path / "arms").glob("*.tmp"))


def _arm(per_domain, tokens, wall):
    r = rows(per_domain)
    return {"per_request": {"T0": r, "T1": r}, "supervised_tokens": tokens, "wall_s": wall}


def test_assemble_intervals_and_paired_differences():
    # continued SFT: a = (10 + 6) / (5 + 3) = 2.0, b = (9 + 12) / (3 + 4) = 3.0, mean 2.5
    # Draft-OPD:     a = (12 + 9) / (5 + 3) = 2.625, b = (12 + 12) / (3 + 4) = 24/7, mean (2.625 + 24/7) / 2
    base = {"a": [(10, 5), (6, 3)], "b": [(9, 3), (12, 4)]}
    results = {"sft_continued": _arm(base, 896, 8.0),
               "draft_opd": _arm({"a": [(12, 5), (9, 3)], "b": [(12, 3), (12, 4)]}, 1000, 4.0),
               "sft_start": {**_arm(base, 0, None)}}
    m = store.assemble(results, DOMAINS, n_boot=400)
    assert m["arms"] == ["sft_start", "sft_continued", "draft_opd"]
    c = m["acceptance"]["sft_continued"]["T0"]
    assert (c["a"], c["b"], c["mean"]) == (pytest.approx(2.0), pytest.approx(3.0), pytest.approx(2.5))
    assert c["prompts"] == {"a": 2, "b": 2} and c["ci95"][0] <= 2.5 <= c["ci95"][1]
    d = m["acceptance"]["draft_opd"]["T1"]
    assert d["mean"] == pytest.approx((2.625 + 24 / 7) / 2)
    diff = m["paired_diff_vs_sft_continued"]["draft_opd"]["T0"]
    assert diff["by_domain"]["a"]["mean"] == pytest.approx(0.625)
    assert diff["by_domain"]["b"]["mean"] == pytest.approx(24 / 7 - 3)
    assert diff["mean"] == pytest.approx((0.625 + 24 / 7 - 3) / 2) and diff["prompts"] == {"a": 2, "b": 2}
    # the start equals the baseline prompt by prompt: every paired replicate is 0, so the interval is [0, 0]
    same = m["paired_diff_vs_sft_continued"]["sft_start"]["T0"]
    assert same["mean"] == 0.0 and same["ci95"] == [0.0, 0.0] and same["inside_noise"] is True
    assert "sft_continued" not in m["paired_diff_vs_sft_continued"]
    assert "sft_start" in m["inside_noise"]["T0"] and "draft_opd" not in m["inside_noise"]["T0"]
    assert m["supervised_tokens_per_s"] == {"sft_start": None, "sft_continued": 112.0, "draft_opd": 250.0}
    assert m["supervised_tokens"]["draft_opd"] == 1000 and m["wall_s"]["sft_continued"] == 8.0
    f = store.floors(m)
    assert f["draft_opd_beats_continued_sft_T0"] is True and f["draft_opd_gain_outside_noise_T0"] is True
    json.dumps(m)


def test_assemble_without_baseline_or_with_a_silent_domain():
    m = store.assemble({"draft_opd": _arm({"a": [(4, 2)], "b": [(1, 0)]}, 10, 1.0)}, DOMAINS, n_boot=50)
    assert "b" in m["acceptance"]["draft_opd"]["T0"]["error"]  # no verify steps in b: no interval, no crash
    assert m["paired_diff_vs_sft_continued"] == {} and m["inside_noise"] == {"T0": [], "T1": []}
    assert store.floors(m) == {"draft_opd_beats_continued_sft_T0": None, "draft_opd_gain_outside_noise_T0": None}


def test_plot_writes_a_png(tmp_path: Path):
    base = {"a": [(10, 5), (6, 3)], "b": [(9, 3), (12, 4)]}
    m = store.assemble({"sft_continued": _arm(base, 1, 1.0), "draft_opd": _arm(base, 1, 1.0)}, DOMAINS, n_boot=50)
    from draft_opd_compare.plot import save_plot

    assert save_plot(m, tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys, tiny_drafter: Path):
    out = tmp_path / "r.json"
    cases = [([], "the following arguments are required: --start"),
             (["--start", str(tmp_path)], "not a drafter directory"),
             (["--start", str(tiny_drafter), "--arms", "draft_opd,nope"], "--arms: unknown nope"),
             (["--start", str(tiny_drafter), "--budget-tokens", "0"], "--budget-tokens must be >= 1"),
             (["--start", str(tiny_drafter), "--eval-limit", "0"], "--eval-limit must be >= 1"),
             (["--start", str(tiny_drafter), "--rollout-tokens", "1"], "--rollout-tokens"),
             (["--start", str(tiny_drafter), "--budget-tokens", "x"], "invalid int value"),
             (["--start", str(tiny_drafter), "--lr-specopd", "0"], "--lr-specopd must be > 0"),
             (["--start", str(tiny_drafter), "--eval-split", "validation", "--val-offset", "100", "--eval-limit",
               "9"], "validation prompts [100, 109) overlap the training references [108, 168)"),
             (["--start", str(tiny_drafter), "--eval-split", "test"], "invalid choice")]
    for argv, msg in cases:
        assert _exit_code(argv + ["--out", str(out), "--run-dir", str(tmp_path / "run")]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and "\n" not in err.strip(), (argv, err)
    # a run directory made with another budget is refused before any server starts
    store.check_setup(tmp_path / "run2", {"start_sha256": "other"})
    assert MOD.main(["--start", str(tiny_drafter), "--run-dir", str(tmp_path / "run2"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "was made with other settings" in err and "\n" not in err.strip()
    assert not out.exists()


def test_validation_split_and_specopd_lr(tmp_path: Path, monkeypatch):
    """--eval-split validation measures on train-split prompts [val_offset, val_offset + eval_limit) per domain
    (never the eval split); --lr-specopd reaches the SpecOPD arm's config; both enter the run's setup only when
    set (run directories made before them still match)."""
    import specopd_trainer.evaluate as evaluate
    from specopd_trainer.pipeline import train_split_records

    seen = []

    def fake_eval(url, tok, domains, *, temperature, limit, max_new_tokens, concurrency, records, progress):
        seen.append((temperature, records, limit))
        return {"per_request": [], "tau": {}, "mean_tau": 1.0}

    monkeypatch.setattr(evaluate, "evaluate_acceptance", fake_eval)
    s = _session(tmp_path, 10, eval_split="validation", val_offset=100, eval_limit=2, eval_max_new_tokens=8,
                 eval_concurrency=1)
    s.domains = ("dialogue", "math")
    assert train.evaluate_per_request(s) == {"T0": [], "T1": []}
    assert [t for t, _, _ in seen] == [0.0, 1.0]
    records = seen[0][1]
    assert {d: [r["id"] for r in v] for d, v in records.items()} == {
        d: [r["id"] for r in train_split_records(100, 2, [d])] for d in ("dialogue", "math")}
    assert all(len(v) == 2 for v in records.values())
    seen.clear()
    s.args = SimpleNamespace(eval_limit=2, eval_max_new_tokens=8, eval_concurrency=1)  # the default: eval split
    train.evaluate_per_request(s)
    assert seen[0][1] is None and seen[0][2] == 2
    base = MOD.parse_args(["--start", "x"])
    assert "eval_split" not in MOD.setup_of(base, "sha") and "lr_specopd" not in MOD.setup_of(base, "sha")
    val = MOD.parse_args(["--start", "x", "--eval-split", "validation", "--lr-specopd", "1e-4"])
    assert MOD.setup_of(val, "sha")["eval_split"] == "validation" and MOD.setup_of(val, "sha")["val_offset"] == 100
    assert MOD.setup_of(val, "sha")["lr_specopd"] == 1e-4
    assert arms.specopd_recipe_config(14336, 7, lr=1e-4).lr == 1e-4
    from specopd_trainer.algorithms.specopd import RECIPE

    assert arms.specopd_recipe_config(14336, 7).lr == RECIPE["lr"]


def _exit_code(argv) -> int:
    """main()'s return value, or the code of the SystemExit argparse raises."""
    try:
        return MOD.main(argv)
    except SystemExit as exc:
        return exc.code


def test_merge_only_writes_the_result_from_finished_arms(tmp_path: Path, tiny_drafter: Path, monkeypatch):
    """--merge-only: no server; the finished arms of the run directory become the result (+ PNG)."""
    run, out = tmp_path / "run", tmp_path / "res" / "r.json"
    live = tmp_path / "live.json"
    live.write_text(json.dumps({"live_traffic": {"minutes": 15.0, "serving_errors": 0}}))
    argv = ["--start", str(tiny_drafter), "--run-dir", str(run), "--out", str(out), "--merge-only",
            "--live-traffic-result", str(live)]
    monkeypatch.setattr(MOD, "DOMAINS", DOMAINS)
    assert MOD.main(argv) == 1 and not out.exists()  # nothing finished yet
    base = {"a": [(10, 5), (6, 3)], "b": [(9, 3), (12, 4)]}
    store.save_arm(run, "sft_continued", {**_arm(base, 896, 8.0), "budget_fraction": 1.0, "steps": 1})
    store.save_arm(run, "draft_opd", {**_arm(base, 1000, 4.0), "budget_fraction": 1.1, "steps": 2})
    assert MOD.main(argv) == 0
    res = json.loads(out.read_text())
    assert res["arms"] == ["sft_continued", "draft_opd"] and res["budget_target_tokens"] == 229376
    assert res["start"]["sha256"] == json.loads((run / "setup.json").read_text())["start_sha256"]
    assert len(res["start"]["sha256"]) == 64 and res["start"]["path"] == portable(str(tiny_drafter.resolve()))
    assert res["supervised_tokens_per_s"]["draft_opd"] == 250.0 and res["budget_fraction"]["draft_opd"] == 1.1
    assert res["paired_diff_vs_sft_continued"]["draft_opd"]["T0"]["mean"] == 0.0
    assert res["eval"]["meets_24_prompt_rule"] is True and "git_commit" in res and "--merge-only" in res["command"]
    assert res["live_traffic"] == {"minutes": 15.0, "serving_errors": 0, "source": portable(str(live))}
    assert res["missing_arms"] == ["sft_start", "specopd", "sequential_opd", "draft_opd_no_replay",
                                   "draft_opd_fkl_only", "draft_opd_rkl_only", "draft_opd_random_anchors",
                                   "draft_opd_first_rejection"]
    assert out.with_suffix(".png").is_file()


def test_restore_from_a_result_seeds_the_missing_arms(tmp_path: Path, tiny_drafter: Path, monkeypatch):
    """--restore-from: the arms of a committed result come back into a new run directory (same numbers when merged
    again); arms already finished there win; a result made with another budget is refused with one line."""
    run, out, out2 = tmp_path / "run", tmp_path / "res" / "r.json", tmp_path / "res2" / "r.json"
    monkeypatch.setattr(MOD, "DOMAINS", DOMAINS)
    base = {"a": [(10, 5), (6, 3)], "b": [(9, 3), (12, 4)]}
    store.save_arm(run, "sft_continued", {**_arm(base, 896, 8.0), "budget_fraction": 1.0, "steps": 1})
    store.save_arm(run, "draft_opd", {**_arm({"a": [(12, 5), (9, 3)], "b": [(12, 3), (12, 4)]}, 1000, 4.0),
                                      "budget_fraction": 1.1, "steps": 2, "topups": 1})
    argv = ["--start", str(tiny_drafter), "--merge-only", "--live-traffic-result", str(tmp_path / "none.json")]
    assert MOD.main(argv + ["--run-dir", str(run), "--out", str(out)]) == 0
    first = json.loads(out.read_text())
    new_run = tmp_path / "new_run"  # a new machine: no run directory, only the result; one arm re-run there
    store.save_arm(new_run, "draft_opd", {**_arm(base, 7, 1.0), "budget_fraction": 0.5, "steps": 9})
    assert MOD.main(argv + ["--run-dir", str(new_run), "--out", str(out2), "--restore-from", str(out)]) == 0
    restored = store.finished_arms(new_run)
    assert restored["sft_continued"]["per_request"] == first["per_request"]["sft_continued"]
    assert restored["sft_continued"]["steps"] == 1 and restored["sft_continued"]["wall_s"] == 8.0
    assert restored["sft_continued"]["restored_from"] == first["git_commit"]
    assert restored["draft_opd"]["steps"] == 9  # finished in the run directory: not replaced
    second = json.loads(out2.read_text())
    assert second["acceptance"]["sft_continued"] == first["acceptance"]["sft_continued"]
    assert second["paired_diff_vs_sft_continued"]["draft_opd"]["T0"]["mean"] == 0.0  # the re-run arm's rows
    other = tmp_path / "other"
    rc = MOD.main(argv + ["--run-dir", str(other), "--out", str(out2), "--restore-from", str(out),
                          "--budget-tokens", "7"])
    assert rc == 2 and not (other / "arms").exists()
    with pytest.raises(store.SetupMismatchError, match=r"\(budget_tokens\)"):
        store.restore_arms(other, first, {**json.loads((run / "setup.json").read_text()), "budget_tokens": 7})
    assert MOD.main(argv + ["--run-dir", str(other), "--restore-from", str(tmp_path / "missing.json")]) == 2


@pytest.mark.server
def test_two_arms_end_to_end_on_the_tiny_target(tiny_serving_target: Path, tiny_drafter: Path, tmp_path: Path):
    """~2-4 min: a tiny fp32 SPECOPD server; continued SFT and Draft-OPD from the tiny drafter at a 48-token budget,
    each pushed hot and evaluated on 2 held-out prompts per domain at T0/T1; then a re-run skips both."""
    from sglang_specopd.app.launch.process import free_port

    cfg = tiny_specopd_config(tmp_path / "tiny.yaml", tiny_serving_target, tiny_drafter, "tiny-draft-opd-compare")
    run, out = tmp_path / "run", tmp_path / "r.json"
    argv = ["--start", str(tiny_drafter), "--config", str(cfg), "--arms", "sft_continued,draft_opd",
            "--budget-tokens", "48", "--run-dir", str(run), "--out", str(out), "--refs-dir", str(tmp_path / "refs"),
            "--refs-per-domain", "2", "--refs-max-new-tokens", "16", "--rollout-prompts", "2",
            "--rollout-tokens", "16", "--max-blocks", "8", "--eval-limit", "2", "--eval-max-new-tokens", "12",
            "--eval-concurrency", "4", "--server-threads", "1", "--progress-every-s", "2", "--port", str(free_port())]
    assert MOD.main(argv) == 0
    res = json.loads(out.read_text())
    assert res["arms"] == ["sft_continued", "draft_opd"]
    for arm in res["arms"]:
        for t in ("T0", "T1"):
            a = res["acceptance"][arm][t]
            assert "error" not in a, a
            assert 1.0 <= a["mean"] <= 4.0 and a["ci95"][0] <= a["mean"] <= a["ci95"][1]
            rows = res["per_request"][arm][t]
            assert sorted(r["domain"] for r in rows) == sorted(MOD.DOMAINS * 2)
            # a request the target ends at its first token (EOS sampled at T1) has no verify step: it is left out
            assert a["prompts"] == {d: sum(1 for r in rows if r["domain"] == d and r["verify_steps"] > 0)
                                    for d in MOD.DOMAINS}
            assert sum(a["prompts"].values()) >= 4 and all(n >= 1 for n in a["prompts"].values())
        assert (run / f"drafter-{arm}" / "model.safetensors").is_file()
    d = res["paired_diff_vs_sft_continued"]["draft_opd"]["T0"]
    assert "mean" in d and all(1 <= d["prompts"][dd] <= 2 for dd in MOD.DOMAINS)
    # budgets: continued SFT 1 step of 8 x 16 x 3 slots; Draft-OPD 2 planned steps of at most 8 blocks x 3 slots,
    # topped up (at most 3 x 2 more steps) while the tiny target's few error blocks leave it below the budget
    assert res["supervised_tokens"]["sft_continued"] == 384 and res["steps"]["sft_continued"] == 1
    tokens, topups = res["supervised_tokens"]["draft_opd"], res["topups"]["draft_opd"]
    assert 0 < tokens < 48 + 24 and res["steps"]["draft_opd"] <= 2 + 2 * topups
    assert tokens >= 48 or topups == 3, (tokens, topups)
    assert res["supervised_tokens_per_s"]["draft_opd"] > 0 and res["wall_s"]["draft_opd"] > 0
    assert res["eval"]["meets_24_prompt_rule"] is False and out.with_suffix(".png").is_file()
    assert len(res["per_request"]["draft_opd"]["T1"]) == 8
    # finished arms are kept: a re-run trains nothing (no server) and merges the same arms again
    mtime = (run / "arms" / "draft_opd.json").stat().st_mtime
    assert MOD.main(argv) == 0 and (run / "arms" / "draft_opd.json").stat().st_mtime == mtime
