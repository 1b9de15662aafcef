"""DFlash vs DFlash V2 vs DSpark drafters on SmolLM2 at equal size and equal budgets: SFT, then SpecOPD (issue 22).

Each architecture (``--archs``, default all three) runs the phases of ``drafter_archs/store.py``: a fresh drafter
sized exactly like the shipped reference drafter (``--size-from``: 2 layers, block 8, context layers [1, 27], its
mask token; ``--seed``), SFT on the same sequences for the same number of supervised draft tokens
(``--sft-tokens``), held-out evaluation, SpecOPD from that SFT drafter with the validated recipe (README "Using it")
for ``--opd-tokens`` supervised tokens on references the SFT never saw, evaluation again, and serving throughput of
the SpecOPD drafter against plain serving at concurrency 1 and 4 (``specopd bench serve --launch-baseline``).
Evaluation: SGLang's own per-request statistics on the held-out eval split (``--eval-limit`` prompts per domain, at
least 24 for the result to count) at T=0 and T=1, on a server of that architecture (SPECOPD for dflash / dflash2,
SPECOPD_DSPARK for dspark: a hot swap cannot change the architecture), each drafter pushed into it hot.

Every finished phase is kept in ``--run-dir`` (layout: ``drafter_archs/store.py``): a killed run resumes where it
stopped (SFT and SpecOPD from their last checkpoint, an evaluation at the temperature it was measuring);
``--merge-only`` writes the result from whatever is finished, listing the rest under ``missing_phases``;
``--no-serve`` leaves the serving phase for a later run on a quiet machine. Progress lines carry the ETA of the
phase and of the whole run. Writes ``benchmarks/results/drafter_archs_smollm2_cpu.json``
(per architecture and stage tau per domain and overall with 95% bootstrap intervals; paired differences of DFlash V2
and DSpark vs DFlash on the same prompts after SFT and after SpecOPD, and of each one's SpecOPD vs its own SFT, with
``inside_noise`` flags; supervised tokens, steps and wall time per phase; parameter counts; output tokens/s of
speculative and plain serving and the speedup at each level) and a PNG beside it::

    python benchmarks/drafter_archs/run.py                      # everything (resumes)
    python benchmarks/drafter_archs/run.py --archs dspark       # one architecture
    python benchmarks/drafter_archs/run.py --merge-only         # the result from the finished phases

Default budgets, sized for ~3.8 h for all three architectures on the 2-core AMD EPYC machine with nothing else
running (step costs in ``drafter_archs/eta.py``, which prints the ETA and rescales it by the phases finished so far).
Measured by a smoke run of this script on SmolLM2 (8 SFT and 6 SpecOPD steps per architecture on the real data):
one SFT step (8 sequences x 16 anchors x 7 slots = 896 supervised tokens) costs 3.73 s for DFlash, 3.76 s for V2 and
3.98 s for DSpark; one SpecOPD recipe step (912 supervised tokens, server scoring included) 9.0 / 12.2 / 10.5 s;
a SmolLM2 server takes ~90 s to start; the data (context features of the 400 SFT sequences, 200,192 tokens) ~13
min once. Estimated from concurrency_reference_smollm2_cpu.json, scaled to tau ~1.2: one evaluation (96 prompts x
64 new tokens at T0 and at T1, concurrency 8, ~12 tok/s) ~18 min; the serving check (6 prompts per domain, 64
tokens, c=1 and c=4, two server starts) ~14 min. With ``--sft-tokens 229376`` (256 steps, ~16-17 min) and
``--opd-tokens 29184`` (32 steps, ~5-7 min) an architecture takes ~71-73 min, of which the two evaluations are half
(the 24-prompt rule at T0 and T1). 256 SFT steps from scratch reach a held-out walk tau of ~1.2 on the reference
drafter's curve (reference_drafter_smollm2_cpu.json's plateau, under a longer schedule), far from its 1.7 plateau:
this compares the architectures at a short equal budget, not converged drafters.

The smoke run's step costs were measured beside other jobs: the committed result (half these budgets, its command
in the file) measured one SFT step at 1.5-1.8 s, one SpecOPD step at 1.7 s (DFlash) to 2.4 s (DSpark), and one
evaluation temperature (96 prompts x 48 tokens at concurrency 16) at 65-150 s on a quiet machine; ``eta.py``
rescales its defaults by the finished phases, so the ETA corrects itself after the first phase.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # drafter_archs/, draft_opd_compare/, concurrency_reference

from draft_opd_compare.cli import CompareError, OneLineParser, require_at_least  # noqa: E402
from drafter_archs.store import ArchsError, select_archs  # noqa: E402

DOMAINS = ("dialogue", "coding", "math", "agentic")
MIN_EVAL_PROMPTS = 24  # the measurement rule: at least 24 held-out prompts per domain
REFERENCE = "sglang_specopd/assets/drafters/SmolLM2-135M-Instruct-b8"


def parse_args(argv=None):
    ap = OneLineParser(prog="drafter_archs_smollm2", description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="all", help="comma-separated architectures: dflash,dflash2,dspark (default all)")
    ap.add_argument("--config", default="cpu-smollm2", help="server config (name or YAML path), SPECOPD")
    ap.add_argument("--size-from", default=REFERENCE, help="drafter whose sizes every architecture copies")
    ap.add_argument("--seed", type=int, default=0, help="init and training seed (the same for every architecture)")
    ap.add_argument("--sft-tokens", type=int, default=229376, help="SFT budget: supervised draft tokens per arch")
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--sft-seqs-per-step", type=int, default=8)
    ap.add_argument("--sft-anchors-per-seq", type=int, default=16)
    ap.add_argument("--sft-per-domain", type=int, default=100, help="SFT sequences per domain (reference corpus)")
    ap.add_argument("--sft-snapshot", default="benchmarks/data/reference_corpus",
                    help="committed response snapshot the SFT sequences come from ('' = generate them all)")
    ap.add_argument("--sft-max-new-tokens", type=int, default=384, help="when an SFT response must be generated")
    ap.add_argument("--sft-max-prompt-tokens", type=int, default=1536)
    ap.add_argument("--opd-tokens", type=int, default=29184, help="SpecOPD budget: supervised draft tokens per arch")
    ap.add_argument("--opd-lr", type=float, default=None, help="SpecOPD's peak LR (default: its recipe's)")
    ap.add_argument("--refs-dir", default="runs/draft_opd_refs", help="SpecOPD references (cached; shared with "
                    "benchmarks/draft_opd_compare/run.py, same prompts and settings)")
    ap.add_argument("--refs-offset", type=int, default=108, help="first train-split prompt per domain of the refs")
    ap.add_argument("--refs-per-domain", type=int, default=60)
    ap.add_argument("--refs-max-new-tokens", type=int, default=160)
    ap.add_argument("--eval-limit", type=int, default=MIN_EVAL_PROMPTS, help="held-out prompts per domain")
    ap.add_argument("--eval-max-new-tokens", type=int, default=64)
    ap.add_argument("--eval-concurrency", type=int, default=8)
    ap.add_argument("--serve-concurrency", default="1,4", help="bench serve levels")
    ap.add_argument("--serve-limit", type=int, default=6, help="bench serve: held-out prompts per domain")
    ap.add_argument("--serve-max-new-tokens", type=int, default=64)
    ap.add_argument("--serve-temperature", type=float, default=0.0)
    ap.add_argument("--ckpt-every", type=int, default=50, help="training checkpoints (resume points), steps")
    ap.add_argument("--server-threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=0, help="server port (0: a free one)")
    ap.add_argument("--domains", default=",".join(DOMAINS), help=argparse.SUPPRESS)  # tests: fewer domains
    ap.add_argument("--progress-every-s", type=float, default=60.0, help="training progress line every N s")
    ap.add_argument("--run-dir", default="runs/drafter_archs")
    ap.add_argument("--out", default="benchmarks/results/drafter_archs_smollm2_cpu.json")
    ap.add_argument("--merge-only", action="store_true", help="write the result from the finished phases only")
    ap.add_argument("--no-serve", action="store_true",
                    help="run every phase but the serving throughput (which means little while the machine is "
                         "shared); a later run without it measures only that")
    return ap.parse_args(argv)


def check_options(args) -> list:
    """The selected architectures; sets ``args.domains`` (tuple), ``args.serve_levels`` (ints), ``args.sizes``
    and ``args.block_size`` (from ``--size-from``). Raises CompareError / ArchsError for options that cannot make
    a run."""
    archs = select_archs(args.archs)
    require_at_least(args, 1, "sft_tokens", "opd_tokens", "eval_limit", "eval_concurrency", "serve_limit",
                     "sft_per_domain", "refs_per_domain", "ckpt_every", "sft_seqs_per_step", "sft_anchors_per_seq")
    require_at_least(args, 2, "eval_max_new_tokens", "serve_max_new_tokens")
    if args.opd_lr is not None and args.opd_lr <= 0:
        raise CompareError(f"--opd-lr must be > 0, got {args.opd_lr}")
    try:
        args.serve_levels = [int(x) for x in args.serve_concurrency.split(",") if x.strip()]
    except ValueError:
        args.serve_levels = []
    if not args.serve_levels or min(args.serve_levels) < 1 or len(set(args.serve_levels)) != len(args.serve_levels):
        raise CompareError(f"--serve-concurrency: distinct integers >= 1, got {args.serve_concurrency!r}")
    args.domains = tuple(d.strip() for d in args.domains.split(",") if d.strip())
    size_from = Path(args.size_from)
    if not size_from.is_absolute() and not size_from.exists():
        size_from = ROOT / size_from  # the default, from another working directory
    cfg_path = size_from / "config.json"
    if not cfg_path.is_file():
        raise CompareError(f"--size-from {args.size_from}: not a drafter directory (no config.json)")
    cfg = json.loads(cfg_path.read_text())
    dc = cfg.get("dflash_config") or {}
    args.sizes = {"block_size": int(dc["block_size"]), "num_layers": int(cfg["num_hidden_layers"]),
                  "target_layer_ids": list(dc["target_layer_ids"]), "mask_token": dc.get("mask_token")}
    args.block_size = args.sizes["block_size"]
    return archs


def setup_of(args) -> dict:
    """What every finished phase of the run directory must share (``setup.json``)."""
    keys = ("config", "seed", "sft_tokens", "sft_lr", "sft_seqs_per_step", "sft_anchors_per_seq", "sft_per_domain",
            "sft_snapshot", "opd_tokens", "opd_lr", "refs_offset", "refs_per_domain", "refs_max_new_tokens",
            "eval_limit", "eval_max_new_tokens", "serve_limit", "serve_max_new_tokens", "serve_temperature",
            "serve_levels", "domains")
    return {**{k: getattr(args, k) for k in keys}, "sizes": args.sizes, "domains": list(args.domains)}


def main(argv=None) -> int:
    from draft_opd_compare.cli import script_main
    from draft_opd_compare.store import SetupMismatchError
    from sglang_specopd.app.launch.process import ServeError

    return script_main("drafter_archs_smollm2", argv, parse_args, check_options, run,
                       (CompareError, ArchsError, SetupMismatchError, ServeError))


def run(args, archs: list) -> int:
    from draft_opd_compare.store import check_setup
    from drafter_archs.eta import clock, remaining_s
    from drafter_archs.store import finished_phases, missing_phases

    run_dir = Path(args.run_dir)
    check_setup(run_dir, setup_of(args))
    done = finished_phases(run_dir, archs)
    todo = {} if args.merge_only else missing_phases(archs, done)
    if args.no_serve:
        todo = {a: [p for p in ps if p != "serve"] for a, ps in todo.items() if ps != ["serve"]}
    print(f"drafter_archs_smollm2: to run {todo or '(nothing)'}; whole run "
          f"{clock(remaining_s(archs, done, args)) if todo else '-'}", file=sys.stderr)
    failed = {}
    if todo:
        import traceback

        ctx = _context(args, run_dir)
        for arch in todo:
            try:
                run_arch(ctx, archs, arch)
            except Exception as exc:  # noqa: BLE001 -- one architecture's failure must not cost the others theirs
                traceback.print_exc()
                failed[arch] = f"{type(exc).__name__}: {exc}"
                print(f"drafter_archs_smollm2: {arch} stopped: {failed[arch]}; going on with the next", file=sys.stderr)
    rc = write(args, finished_phases(run_dir), failed)  # every architecture the run directory holds, not only --archs
    return 1 if failed else rc


def _context(args, run_dir: Path):
    import torch
    from transformers import AutoTokenizer

    from drafter_archs.phases import Context, load_config
    from sglang_specopd.app.models import resolve_target

    torch.set_num_threads(2)
    import os

    os.environ["SPECOPD_CPU_SERVER_THREADS"] = str(args.server_threads)  # read by launch.server_env on CPU
    cfg = load_config(args)
    if cfg.speculative_algorithm != "SPECOPD":
        raise CompareError(f"--config {args.config} runs {cfg.speculative_algorithm}: the phases need SPECOPD")
    target = str(resolve_target(cfg.target))
    return Context(args=args, run_dir=run_dir, target=target, tok=AutoTokenizer.from_pretrained(target),
                   layer_ids=list(args.sizes["target_layer_ids"]))


def run_arch(ctx, archs: list, arch: str) -> None:
    """Run every unfinished phase of ``arch`` in order, saving each as it finishes."""
    from drafter_archs import phases as ph
    from drafter_archs.eta import calibration, clock, default_s, remaining_s
    from drafter_archs.store import PHASES, finished_phases, save_phase

    def done():
        return finished_phases(ctx.run_dir, archs)

    def start(phase):
        d = done()
        k = calibration(d, ctx.args)
        n = sum(1 for a in archs for p in PHASES if p in d.get(a, {}))
        ctx.rest_s = lambda: remaining_s(archs, done(), ctx.args, skip=(arch, phase))
        est = clock(k * default_s(phase, arch, ctx.args))
        ctx.log(f"[{arch}] {phase} (phase {n + 1} of {len(archs) * len(PHASES)}): ~{est}; whole run "
                f"~{clock(remaining_s(archs, d, ctx.args))}")

    def finish(phase, record):
        save_phase(ctx.run_dir, arch, phase, record)
        ctx.log(f"[{arch}] {phase} finished in {record.get('wall_s', 0):.0f} s")

    have = done()[arch]
    if "init" not in have:
        start("init")
        finish("init", ph.run_init(ctx, arch))
    if "sft" not in have:
        _ensure_data(ctx)
        start("sft")
        finish("sft", ph.run_sft(ctx, arch))
    if any(p not in have for p in ("eval_sft", "specopd", "eval_specopd")):
        stage = "specopd" if "specopd" in have else "sft"
        with ph.arch_server(ctx, arch, stage) as (url, client):
            if "eval_sft" not in have:
                start("eval_sft")
                finish("eval_sft", ph.run_eval(ctx, arch, "eval_sft", "sft", url))
            if "specopd" not in have:
                _ensure_data(ctx)
                start("specopd")
                finish("specopd", ph.run_specopd(ctx, arch, client))
            if "eval_specopd" not in have:
                start("eval_specopd")
                finish("eval_specopd", ph.run_eval(ctx, arch, "eval_specopd", "specopd", url))
    if "serve" not in have and not ctx.args.no_serve:
        start("serve")
        finish("serve", ph.run_serve(ctx, arch))


def _ensure_data(ctx) -> None:
    """Load the SFT sequences and SpecOPD references into ``ctx.data`` (building them through a plain server first
    when the caches are incomplete)."""
    from drafter_archs import data
    from drafter_archs.phases import data_server

    if ctx.data is not None:
        return
    if not data.cached(ctx.args, ctx.run_dir, ctx.layer_ids):
        with data_server(ctx) as client:
            data.build(ctx.args, ctx.run_dir, client, ctx.tok, ctx.layer_ids)
    ctx.data = data.load(ctx.args, ctx.run_dir, ctx.layer_ids)
    ctx.log(f"training data: {json.dumps(ctx.data[2])}")


def write(args, done: dict, failed: dict | None = None) -> int:
    """Merge the finished phases of every architecture into the result file and its plot (1 when nothing has
    finished); the unfinished phases of all three are listed under ``missing_phases``, and the error that stopped
    an architecture in this invocation under ``errors``."""
    from drafter_archs.merge import assemble, summary_lines
    from drafter_archs.plot import save_plot
    from drafter_archs.store import ARCHS, missing_phases

    from sglang_specopd.app.results import write_result
    from specopd_trainer.algorithms.specopd import RECIPE

    if not any(done.values()):
        print("drafter_archs_smollm2: no finished phase to report", file=sys.stderr)
        return 1
    measured = assemble(done, list(args.domains))
    missing = missing_phases(ARCHS, done)
    sft_data = next((p["sft"]["data"] for p in done.values() if "sft" in p), None)
    payload = {
        "target": "SmolLM2-135M-Instruct" if args.config == "cpu-smollm2" else args.config,
        "archs": measured["archs"], "paired_diffs": measured["paired_diffs"], "inside_noise": measured["inside_noise"],
        "budgets": {"unit": "supervised draft tokens per architecture", "sft_tokens": args.sft_tokens,
                    "opd_tokens": args.opd_tokens},
        "sizes": {"from": args.size_from, **args.sizes, "seed": args.seed},
        "sft": {"lr": args.sft_lr, "seqs_per_step": args.sft_seqs_per_step, "anchors_per_seq": args.sft_anchors_per_seq,
                "per_domain": args.sft_per_domain, "snapshot": args.sft_snapshot, "data": sft_data},
        "specopd": {"recipe": RECIPE, "lr": args.opd_lr or RECIPE["lr"],
                    "references": {"dir": args.refs_dir, "split": "train", "offset": args.refs_offset,
                                   "per_domain": args.refs_per_domain, "max_new_tokens": args.refs_max_new_tokens}},
        "eval": {"limit_per_domain": args.eval_limit, "max_new_tokens": args.eval_max_new_tokens,
                 "concurrency": args.eval_concurrency, "temperatures": [0.0, 1.0], "split": "eval"},
        "eval_prompts_per_domain": args.eval_limit,
        "serve": {"concurrency": args.serve_levels, "limit_per_domain": args.serve_limit,
                  "max_new_tokens": args.serve_max_new_tokens, "temperature": args.serve_temperature,
                  "config": args.config},
        "server": {"config": args.config, "cpu_threads": args.server_threads},
        "counts_as_result": args.eval_limit >= MIN_EVAL_PROMPTS,
        "complete": not missing, "missing_phases": missing, "errors": failed or {},
        "per_request": measured["per_request"],
    }
    out = write_result(args.out, payload, command=args.command)
    save_plot(measured, out.with_suffix(".png"))
    for line in summary_lines(measured):
        print(line, file=sys.stderr)
    if missing:
        print(f"missing phases: {json.dumps(missing)}", file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
