"""benchmarks/drafter_archs/run.py and its drafter_archs/ helpers: architecture selection, the phases kept in the
run directory (resume: what is finished, what runs next, what is missing), the SFT data selection, budgets and the
ETA, the merge into the result (tau intervals, paired differences vs DFlash and SpecOPD vs SFT, serving speedups) on
synthetic per-request rows checked by hand, --merge-only, a failing architecture, the report's summary and table,
one-line CLI errors; and one short end-to-end run of a DSpark drafter on the tiny target (marked ``server``): every
phase on real servers but the serving one, which a resumed run then measures with ``bench serve`` stood in for.
Why not the serving phase on real servers too: each tiny SGLang server takes ~60 s to start on the 2-core machine,
and that phase starts two more (``bench serve --launch-baseline`` itself is tests/test_bench.py's)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from _scripts import load_benchmark, tiny_specopd_config

MOD = load_benchmark("drafter_archs")  # puts benchmarks/ on sys.path: the helper package below

from drafter_archs import data, eta, merge, store  # noqa: E402

DOMAINS = ["a", "b"]


def rows(per_domain):
    """per_request rows: {domain: [(completion_tokens, verify_steps), ...]} -> ids a0, a1, ..."""
    return [{"id": f"{d}{i}", "domain": d, "completion_tokens": c, "verify_steps": v}
            for d, xs in per_domain.items() for i, (c, v) in enumerate(xs)]


BASE = {"a": [(10, 5), (6, 3)], "b": [(9, 3), (12, 4)]}  # tau a = 16 / 8 = 2.0, b = 21 / 7 = 3.0, mean 2.5
BETTER = {"a": [(12, 5), (9, 3)], "b": [(12, 3), (12, 4)]}  # a = 21 / 8 = 2.625, b = 24 / 7, mean (2.625 + 24/7) / 2


def _eval(per_domain, wall=10.0):
    r = rows(per_domain)
    return {"per_request": {"T0": r, "T1": r}, "wall_s": wall}


def _serve(spec_plain):
    return {"drafter": "d", "wall_s": 30.0, "levels": [
        {"concurrency": c, "specopd_tokens_per_s": s, "plain_tokens_per_s": p, "speedup": s / p,
         "errors": {"specopd": 0, "plain": 0}, "acceptance": {"mean": 1.5, "ci95": [1.4, 1.6]}}
        for c, (s, p) in spec_plain.items()]}


def _save_full_arch(run, arch, sft_rows, opd_rows, serve):
    store.save_phase(run, arch, "init", {"params": {"checkpoint": 100, "trainable": 60}, "spec": {"block_size": 8},
                                         "drafter": f"{arch}/drafter-init", "wall_s": 1.0})
    store.save_phase(run, arch, "sft", {"supervised_tokens": 896, "steps": 1, "wall_s": 8.0, "drafter": "s",
                                        "data": {"sft_sequences": 8}})
    store.save_phase(run, arch, "eval_sft", _eval(sft_rows))
    store.save_phase(run, arch, "specopd", {"supervised_tokens": 912, "steps": 1, "wall_s": 20.0, "drafter": "o"})
    store.save_phase(run, arch, "eval_specopd", _eval(opd_rows))
    store.save_phase(run, arch, "serve", serve)


def test_select_archs():
    assert store.select_archs(None) == ["dflash", "dflash2", "dspark"] == store.select_archs("all")
    assert store.select_archs("dspark, dflash,dspark") == ["dflash", "dspark"]  # ARCHS order, once
    with pytest.raises(store.ArchsError, match="unknown eagle; valid: dflash, dflash2, dspark"):
        store.select_archs("dflash,eagle")
    with pytest.raises(store.ArchsError, match="none given"):
        store.select_archs(",")


def test_phases_resume_from_the_run_directory(tmp_path: Path):
    run = tmp_path / "run"
    assert store.finished_phases(run) == {"dflash": {}, "dflash2": {}, "dspark": {}}
    assert store.next_phase({}) == "init"
    store.save_phase(run, "dspark", "init", {"wall_s": 1.5})
    store.save_phase(run, "dspark", "sft", {"steps": 3})
    store.save_phase(run, "dspark", "eval_sft", {"per_request": {"T0": [1]}}, temp="T0")  # one temperature only
    done = store.finished_phases(run)
    assert list(done["dspark"]) == ["init", "sft"] and done["dspark"]["sft"] == {"arch": "dspark", "phase": "sft",
                                                                                  "steps": 3}
    assert store.next_phase(done["dspark"]) == "eval_sft"
    assert store.load_phase(run, "dspark", "eval_sft", "T0")["per_request"] == {"T0": [1]}
    assert store.load_phase(run, "dspark", "eval_sft", "T1") is None
    assert store.missing_phases(["dflash", "dspark"], done) == {
        "dflash": list(store.PHASES), "dspark": ["eval_sft", "specopd", "eval_specopd", "serve"]}
    for p in store.PHASES[2:]:
        store.save_phase(run, "dspark", p, {})
    done = store.finished_phases(run)
    assert store.next_phase(done["dspark"]) is None and "dspark" not in store.missing_phases(["dspark"], done)
    assert store.drafter_dir(run, "dflash2", "sft") == run / "dflash2" / "drafter-sft"


def test_sft_selection_skips_the_specopd_prompts_and_fills_from_the_train_split():
    snap = [("d/1#s1", "dialogue"), ("d/1", "dialogue"), ("d/2", "dialogue"), ("d/3", "dialogue"),
            ("c/1", "coding"), ("m/1", "math")]
    got = data.choose_sft_ids(snap, {"coding": ["c/1", "c/2", "c/3"], "math": ["m/9"]}, {"d/2", "c/2"}, 2,
                              ["dialogue", "coding", "math"])
    # greedy before sampled, the SpecOPD prompt d/2 left out; coding filled from the train split past c/2
    assert got == {"dialogue": ["d/1", "d/3"], "coding": ["c/1", "c/3"], "math": ["m/1", "m/9"]}
    assert data.choose_sft_ids(snap, {}, {"d/1"}, 3, ["dialogue"]) == {"dialogue": ["d/2", "d/3"]}  # d/1#s1 too


def _args(**kw):
    base = dict(block_size=8, sft_tokens=229376, sft_seqs_per_step=8, sft_anchors_per_seq=16, opd_tokens=29184,
                domains=("dialogue", "coding", "math", "agentic"), eval_limit=24, eval_max_new_tokens=64,
                serve_limit=6, serve_max_new_tokens=64, serve_levels=[1, 4])
    return SimpleNamespace(**{**base, **kw})


def test_budgets_and_eta():
    a = _args()
    assert eta.steps_of("sft", a) == 256  # 229376 / (8 x 16 x 7)
    assert eta.steps_of("specopd", a) == 32  # 29184 / (2 x (8 x 7 x 7 + 64)) = 32.0
    assert eta.steps_of("sft", _args(sft_tokens=1)) == 1 and eta.steps_of("specopd", _args(opd_tokens=1)) == 1
    assert eta.default_s("sft", "dflash", a) == pytest.approx(256 * 3.75)
    assert eta.default_s("specopd", "dspark", a) == pytest.approx(32 * 10.5)
    # evaluation: 4 x 24 x 64 tokens at T0 and T1 at 12 tok/s, plus half a server start
    assert eta.default_s("eval_sft", "dflash", a) == pytest.approx(45 + 2 * 6144 / 12.0)
    m = 4 * 6 * 64  # serving: both servers at c=1 (5.0, 11.2 tok/s) and c=4 (10.2, 22.3), two server starts
    assert eta.default_s("serve", "dflash", a) == pytest.approx(180 + m / 5.0 + m / 11.2 + m / 10.2 + m / 22.3)
    phases = sum(eta.default_s(p, x, a) for x in store.ARCHS for p in store.PHASES)
    total = eta.remaining_s(store.ARCHS, {}, a)
    assert total == pytest.approx(phases + eta.DATA_S)  # nothing finished: the data too
    assert 3.6 * 3600 < total < 4.0 * 3600  # the defaults are sized for ~3.8 h
    # finished phases rescale the rest: SFT ran 2x its default, the first eval 1x -> median ratio 1.5
    done = {"dflash": {"init": {"wall_s": 99.0}, "sft": {"wall_s": 2 * 256 * 3.75},
                       "eval_sft": {"wall_s": 45 + 2 * 6144 / 12.0}}}
    assert eta.calibration(done, a) == pytest.approx(1.5) and eta.calibration({}, a) == 1.0
    left = eta.remaining_s(["dflash"], done, a)  # an SFT has finished: the data is built
    assert left == pytest.approx(1.5 * sum(eta.default_s(p, "dflash", a) for p in store.PHASES[3:]))
    skip = eta.remaining_s(["dflash"], done, a, skip=("dflash", "specopd"))
    assert left - skip == pytest.approx(1.5 * 32 * 9.0)
    assert "done ~" in eta.clock(3900) and eta.clock(3900).startswith("1 h 05 min")


def test_assemble_intervals_paired_differences_and_serving(tmp_path: Path):
    run = tmp_path / "run"
    _save_full_arch(run, "dflash", BASE, BASE, _serve({1: (6.0, 12.0), 4: (15.0, 20.0)}))
    store.save_phase(run, "dflash2", "init", {"params": {"checkpoint": 130, "trainable": 90}, "wall_s": 1.0})
    store.save_phase(run, "dflash2", "eval_sft", _eval(BETTER))
    m = merge.assemble(store.finished_phases(run), DOMAINS, n_boot=400)
    assert list(m["archs"]) == ["dflash", "dflash2"]
    d = m["archs"]["dflash"]
    acc = d["acceptance"]["sft"]["T0"]
    assert (acc["a"], acc["b"], acc["mean"]) == (pytest.approx(2.0), pytest.approx(3.0), pytest.approx(2.5))
    assert acc["prompts"] == {"a": 2, "b": 2} and acc["ci95"][0] <= 2.5 <= acc["ci95"][1]
    assert d["speedup"] == {"1": 0.5, "4": 0.75} and d["serving"]["4"]["plain_tokens_per_s"] == 20.0
    assert d["serving"]["1"]["tau"] == 1.5 and d["params"] == {"checkpoint": 100, "trainable": 60}
    assert d["supervised_tokens"] == {"sft": 896, "specopd": 912} and d["steps"] == {"sft": 1, "specopd": 1}
    assert d["wall_s"]["specopd"] == 20.0 and d["wall_s"]["eval_sft"] == 10.0
    v2 = m["archs"]["dflash2"]
    assert v2["acceptance"]["sft"]["T1"]["mean"] == pytest.approx((2.625 + 24 / 7) / 2)
    assert "specopd" not in v2["acceptance"] and v2["speedup"] == {} and v2["supervised_tokens"] == {}
    diff = m["paired_diffs"]["vs_dflash"]["sft"]["dflash2"]["T0"]
    assert diff["by_domain"]["a"]["mean"] == pytest.approx(0.625)
    assert diff["by_domain"]["b"]["mean"] == pytest.approx(24 / 7 - 3)
    assert diff["mean"] == pytest.approx((0.625 + 24 / 7 - 3) / 2) and diff["inside_noise"] is False
    assert "specopd" in m["paired_diffs"]["vs_dflash"] and m["paired_diffs"]["vs_dflash"]["specopd"] == {}
    own = m["paired_diffs"]["specopd_vs_sft"]
    assert list(own) == ["dflash"] and own["dflash"]["T1"]["ci95"] == [0.0, 0.0]  # the same rows: every replicate 0
    assert m["inside_noise"] == ["dflash specopd vs sft, T0", "dflash specopd vs sft, T1"]
    assert m["per_request"]["dflash2"]["sft"]["T0"] == rows(BETTER)
    lines = merge.summary_lines(m)
    assert any(line.startswith("dflash2 sft: tau T0 3.027") and "vs dflash T0 +0.527" in line for line in lines)
    assert "dflash serving vs plain: c=1 0.50x, c=4 0.75x" in lines
    json.dumps(m)


def test_assemble_with_a_silent_domain():
    run_rows = {"dspark": {"eval_sft": {"per_request": {"T0": rows({"a": [(4, 2)], "b": [(1, 0)]}),
                                                        "T1": rows({"a": [(4, 2)], "b": [(3, 1)]})}}}}
    m = merge.assemble(run_rows, DOMAINS, n_boot=50)
    assert "b" in m["archs"]["dspark"]["acceptance"]["sft"]["T0"]["error"]  # no verify steps in b: no interval
    assert m["archs"]["dspark"]["acceptance"]["sft"]["T1"]["mean"] == pytest.approx(2.5)
    assert m["paired_diffs"] == {"vs_dflash": {}, "specopd_vs_sft": {}} and m["inside_noise"] == []


def _exit_code(argv) -> int:
    try:
        return MOD.main(argv)
    except SystemExit as exc:
        return exc.code


def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys):
    out = tmp_path / "r.json"
    cases = [(["--archs", "dflash,nope"], "--archs: unknown nope"),
             (["--sft-tokens", "0"], "--sft-tokens must be >= 1"),
             (["--eval-limit", "0"], "--eval-limit must be >= 1"),
             (["--serve-concurrency", "1,x"], "--serve-concurrency: distinct integers >= 1"),
             (["--serve-concurrency", "4,4"], "--serve-concurrency"),
             (["--opd-lr", "0"], "--opd-lr must be > 0"),
             (["--size-from", str(tmp_path)], "not a drafter directory"),
             (["--opd-tokens", "x"], "invalid int value")]
    for argv, msg in cases:
        assert _exit_code(argv + ["--out", str(out), "--run-dir", str(tmp_path / "run")]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and "\n" not in err.strip(), (argv, err)
    assert not out.exists()


def test_merge_only_writes_the_result_from_finished_phases(tmp_path: Path, capsys):
    """--merge-only: no server; finished phases become the result (+ PNG), the others are listed as missing; a run
    directory made with other settings is refused."""
    run, out = tmp_path / "run", tmp_path / "res" / "r.json"
    argv = ["--run-dir", str(run), "--out", str(out), "--merge-only", "--domains", "a,b"]
    assert MOD.main(argv) == 1 and not out.exists()  # nothing finished yet
    _save_full_arch(run, "dflash", BASE, BETTER, _serve({1: (6.0, 12.0), 4: (15.0, 20.0)}))
    store.save_phase(run, "dspark", "init", {"params": {"checkpoint": 120, "trainable": 80}, "wall_s": 1.0})
    store.save_phase(run, "dspark", "eval_sft", _eval(BETTER))
    assert MOD.main(argv) == 0
    res = json.loads(out.read_text())
    assert list(res["archs"]) == ["dflash", "dspark"] and res["complete"] is False and res["errors"] == {}
    assert res["missing_phases"] == {"dflash2": list(store.PHASES),
                                     "dspark": ["sft", "specopd", "eval_specopd", "serve"]}
    assert res["archs"]["dflash"]["speedup"] == {"1": 0.5, "4": 0.75}
    assert res["archs"]["dflash"]["acceptance"]["specopd"]["T0"]["mean"] == pytest.approx((2.625 + 24 / 7) / 2)
    assert res["paired_diffs"]["vs_dflash"]["sft"]["dspark"]["T0"]["mean"] == pytest.approx((0.625 + 24 / 7 - 3) / 2)
    assert res["paired_diffs"]["specopd_vs_sft"]["dflash"]["T0"]["mean"] == pytest.approx((0.625 + 24 / 7 - 3) / 2)
    assert res["budgets"]["sft_tokens"] == 229376 and res["budgets"]["opd_tokens"] == 29184
    assert res["sizes"]["block_size"] == 8 and res["sizes"]["num_layers"] == 2
    assert res["sizes"]["target_layer_ids"] == [1, 27] and res["sft"]["data"] == {"sft_sequences": 8}
    assert res["counts_as_result"] is True and res["eval_prompts_per_domain"] == 24
    assert "git_commit" in res and "--merge-only" in res["command"] and res["per_request"]["dspark"]["sft"]
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "dflash specopd: tau T0 3.027" in capsys.readouterr().err
    _report_reads(res)
    assert MOD.main(argv + ["--sft-tokens", "7"]) == 2  # the run directory holds phases made with another budget
    assert "was made with other settings (sft_tokens)" in capsys.readouterr().err


def test_a_failing_architecture_does_not_stop_the_others(tmp_path: Path, monkeypatch):
    """An architecture whose phase raises is reported under ``errors`` (exit 1); the next one still runs and the
    result merges what finished."""
    run, out = tmp_path / "run", tmp_path / "r.json"
    calls = []

    def fake_run_arch(ctx, archs, arch):
        calls.append(arch)
        if arch == "dflash":
            raise RuntimeError("server died")
        _save_full_arch(run, arch, BASE, BETTER, _serve({1: (6.0, 12.0)}))

    monkeypatch.setattr(MOD, "_context", lambda args, run_dir: None)
    monkeypatch.setattr(MOD, "run_arch", fake_run_arch)
    argv = ["--archs", "dspark,dflash", "--run-dir", str(run), "--out", str(out), "--domains", "a,b"]
    assert MOD.main(argv) == 1 and calls == ["dflash", "dspark"]
    res = json.loads(out.read_text())
    assert res["errors"] == {"dflash": "RuntimeError: server died"} and list(res["archs"]) == ["dspark"]
    assert res["missing_phases"] == {"dflash": list(store.PHASES), "dflash2": list(store.PHASES)}
    assert res["archs"]["dspark"]["speedup"] == {"1": 0.5}


def _report_reads(res):
    """`specopd bench report` on the result: the summary item and the table carry its numbers."""
    from sglang_specopd.app.bench.report.archs import NAME, drafter_archs_section
    from sglang_specopd.app.bench.report.summary import results_summary

    text = "\n".join(results_summary({NAME: res}))
    assert "**Drafter architectures** (`drafter_archs_smollm2_cpu.json`, 2 layers, block 8 each)" in text
    assert "SFT 229,376 then SpecOPD 29,184 supervised draft tokens per architecture" in text
    assert "dflash: SFT 2.500 [" in text and "SpecOPD 3.027 [" in text and "(vs its SFT +0.527 [" in text
    assert "T1 3.027; serving vs plain 0.50x / 0.75x at concurrency 1 / 4" in text
    assert "dspark: SFT 3.027 [" in text and "(vs DFlash +0.527 [" in text
    assert text.endswith("Not run yet: dflash2 init/sft/eval_sft/specopd/eval_specopd/serve, dspark "
                         "sft/specopd/eval_specopd/serve.")
    table = "\n".join(drafter_archs_section(res))
    assert "| dflash | SFT | 2.500 [" in table and "| 896 | 8 | 60 |" in table
    assert "| dflash | 4 | 15.00 | 20.00 | 0.75x | 1.500 |" in table
    assert drafter_archs_section({}) == [] and results_summary({NAME: {"archs": {}}})[-1] == "No result file yet."


def _fake_bench_serve(calls, spec_plain):
    """A stand-in for ``phases.bench_serve``: records the command and writes a payload with the given output tokens/s
    per level ({concurrency: (spec, plain)}) and 3 requests per domain, 20 tokens in 8 verify steps each (tau 2.5);
    exit status 0."""

    def run(cmd, env):
        calls.append((cmd, env))
        domains = cmd[cmd.index("--domains") + 1].split(",")
        reqs = [{"id": f"{d}/{i}", "domain": d, "ok": True, "completion_tokens": 20, "verify_ct": 8}
                for d in domains for i in range(3)]
        levels = [{"concurrency": c, "specopd": {"output_tokens_per_s": sp, "errors": 0, "per_request": reqs},
                   "baseline": {"output_tokens_per_s": pl, "errors": 0}} for c, (sp, pl) in spec_plain.items()]
        out = Path(cmd[cmd.index("--out") + 1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"levels": levels}))
        return 0

    return run


@pytest.mark.server
def test_one_architecture_end_to_end_on_the_tiny_target(tiny_serving_target: Path, tiny_drafter: Path,
                                                         tmp_path: Path, monkeypatch):
    """~2.5 min (two tiny servers: the data server and the DSpark one): a DSpark drafter (SPECOPD_DSPARK server)
    through init, SFT, evaluation, SpecOPD (its trees scored on the DSpark server) and evaluation on the tiny fp32
    target with one-step budgets, two domains and 2 held-out prompts each, under --no-serve; then a second run
    resumes with only the serving phase (``bench serve`` replaced by a stand-in: its command line and the merge of
    its payload are checked, the launch itself is tests/test_bench.py's), and a third finds everything finished."""
    from drafter_archs import phases

    cfg = tiny_specopd_config(tmp_path / "tiny.yaml", tiny_serving_target, tiny_drafter, "tiny-drafter-archs")
    run, out = tmp_path / "run", tmp_path / "r.json"
    argv = ["--archs", "dspark", "--config", str(cfg), "--size-from", str(tiny_drafter), "--domains", "dialogue,math",
            "--sft-tokens", "48", "--opd-tokens", "8", "--sft-snapshot", "", "--sft-per-domain", "2",
            "--sft-max-new-tokens", "16", "--refs-dir", str(tmp_path / "refs"), "--refs-per-domain", "2",
            "--refs-max-new-tokens", "16", "--eval-limit", "2", "--eval-max-new-tokens", "12", "--serve-limit", "1",
            "--ckpt-every", "1", "--server-threads", "1", "--progress-every-s", "2", "--run-dir", str(run),
            "--out", str(out)]
    assert MOD.main(argv + ["--no-serve"]) == 0
    res = json.loads(out.read_text())
    # the serving phase and the other architectures have not run: listed, not faked
    assert res["missing_phases"] == {"dflash": list(store.PHASES), "dflash2": list(store.PHASES),
                                     "dspark": ["serve"]}
    assert list(res["archs"]) == ["dspark"] and res["complete"] is False and res["counts_as_result"] is False
    ds = res["archs"]["dspark"]
    assert ds["spec"]["block_size"] == 4 and ds["params"]["trainable"] > 0 and ds["speedup"] == {}
    assert ds["supervised_tokens"]["sft"] == 384 and ds["steps"] == {"sft": 1, "specopd": 1}  # 8 x 16 x 3 slots
    assert 0 < ds["supervised_tokens"]["specopd"] <= 2 * (8 * 7 * 3 + 64)
    for stage in ("sft", "specopd"):
        for t in ("T0", "T1"):
            a = ds["acceptance"][stage][t]
            assert "error" not in a, a
            assert 1.0 <= a["mean"] <= 4.0 and a["ci95"][0] <= a["mean"] <= a["ci95"][1]
            domains = sorted(r["domain"] for r in res["per_request"]["dspark"][stage][t])
            assert domains == ["dialogue"] * 2 + ["math"] * 2
    assert "mean" in res["paired_diffs"]["specopd_vs_sft"]["dspark"]["T0"]
    assert (run / "dspark" / "drafter-specopd" / "model.safetensors").is_file()
    assert json.loads((run / "dspark" / "drafter-sft" / "config.json").read_text())["architectures"] == \
        ["DSparkDraftModel"]
    calls = []
    monkeypatch.setattr(phases, "bench_serve", _fake_bench_serve(calls, {1: (6.0, 12.0), 4: (15.0, 20.0)}))
    mtime = store.phase_path(run, "dspark", "eval_specopd").stat().st_mtime
    assert MOD.main(argv) == 0 and len(calls) == 1  # only the serving phase ran
    cmd, env = calls[0]
    assert cmd[cmd.index("bench"):cmd.index("bench") + 5] == ["bench", "serve", "--launch", str(cfg),
                                                                 "--launch-baseline"]
    assert cmd[cmd.index("--drafter") + 1] == str(run / "dspark" / "drafter-specopd")
    assert cmd[cmd.index("--concurrency") + 1] == "1,4" and cmd[cmd.index("--limit") + 1] == "1"
    assert cmd[cmd.index("--temperature") + 1] == "0" and env["SPECOPD_CPU_SERVER_THREADS"] == "1"
    assert store.phase_path(run, "dspark", "eval_specopd").stat().st_mtime == mtime
    res = json.loads(out.read_text())
    ds = res["archs"]["dspark"]
    assert ds["speedup"] == {"1": 0.5, "4": 0.75} and ds["serving"]["4"]["tau"] == pytest.approx(2.5)
    assert ds["serve_drafter"].endswith("drafter-specopd") and "dspark" not in res["missing_phases"]
    mtime = store.phase_path(run, "dspark", "serve").stat().st_mtime
    assert MOD.main(argv) == 0 and len(calls) == 1  # everything finished: merged again, nothing run
    assert store.phase_path(run, "dspark", "serve").stat().st_mtime == mtime
