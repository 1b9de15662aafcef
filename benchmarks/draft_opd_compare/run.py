"""Draft-OPD vs continued SFT vs SpecOPD vs sequential OPD and Draft-OPD's ablations, from one SFT start, equal budgets.

ONE SPECOPD server (``--config cpu-smollm2``: SmolLM2-135M-Instruct, admin key) starts with the SFT drafter
``--start DIR``. Every arm trains a copy of it with the project's own loop for the same number of target-scored
(supervised) draft tokens (``--budget-tokens``; per-arm accounting in ``draft_opd_compare/arms.py``), is pushed
into that server hot and measured there by SGLang's own per-request statistics on the same held-out prompts
(``--eval-limit`` per domain, at least 24 for the result to count, T=0 and T=1):

  sft_start                 the start itself (no training)
  sft_continued             continued SFT on target references (the baseline of every paired difference)
  draft_opd                 `specopd train draft-opd` (error anchors, replay, forward KL accepted / reverse KL rejected)
  specopd                   `specopd train specopd` with the validated recipe (README "Using it")
  sequential_opd            `specopd train sequential-opd`
  draft_opd_no_replay       --no-replay;   draft_opd_fkl_only / _rkl_only: --loss fkl_only|rkl_only
  draft_opd_random_anchors  --anchors random

The training data of every arm comes from the same train-split prompts (``--refs-offset``, ``--refs-per-domain``):
target responses generated through the same server at T=0 (lossless speculative decoding) with context features,
cached in ``--refs-dir``; the rollout arms roll out their prompts. Each finished arm is kept in ``--run-dir``
(``arms/<arm>.json``, ``drafter-<arm>/``): a re-run skips finished arms (``--redo`` retrains the selected ones) and
``--arms`` selects a subset; the result file merges every finished arm of the run directory (all with the same
start, budget and evaluation settings: ``setup.json``). Run directories are not committed: on a new machine
``--restore-from benchmarks/results/draft_opd_smollm2_cpu.json`` seeds one with the arms of the committed result
(refused if it was made with another start, budget, evaluation or references), so only new arms train. Writes ``benchmarks/results/draft_opd_smollm2_cpu.json``
(per arm tau per domain and overall with 95% bootstrap intervals, paired difference to continued SFT, supervised
tokens / s, wall time) and a PNG beside it::

    python benchmarks/draft_opd_compare/run.py --start runs/reference_drafter/drafter-sft [--arms draft_opd,sft_continued]
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: draft_opd_compare/, specopd_smollm2/

from draft_opd_compare.arms import ArmsError, select_arms  # noqa: E402
from draft_opd_compare.cli import CompareError, OneLineParser, require_at_least  # noqa: E402
from draft_opd_compare.store import SetupMismatchError  # noqa: E402

ADMIN_KEY = "specopd-bench-admin"
DOMAINS = ["dialogue", "coding", "math", "agentic"]
MIN_EVAL_PROMPTS = 24  # the measurement rule: at least 24 held-out prompts per domain


def parse_args(argv=None):
    ap = OneLineParser(prog="draft_opd_smollm2", description=__doc__.splitlines()[0])
    ap.add_argument("--start", required=True, help="the SFT drafter every arm starts from (a drafter directory)")
    ap.add_argument("--arms", default="all", help="comma-separated arms to run (default all; see the module doc)")
    ap.add_argument("--config", default="cpu-smollm2", help="server config (name or YAML path), SPECOPD")
    ap.add_argument("--budget-tokens", type=int, default=229376, help="supervised draft tokens per arm")
    ap.add_argument("--run-dir", default="runs/draft_opd_smollm2")
    ap.add_argument("--out", default="benchmarks/results/draft_opd_smollm2_cpu.json")
    ap.add_argument("--refs-dir", default="runs/draft_opd_refs", help="target references (cached; a re-run resumes)")
    ap.add_argument("--refs-offset", type=int, default=108, help="first train-split prompt per domain of the refs")
    ap.add_argument("--refs-per-domain", type=int, default=60)
    ap.add_argument("--refs-max-new-tokens", type=int, default=160)
    ap.add_argument("--rollout-prompts", type=int, default=16, help="rollout arms: prompts per step (in flight)")
    ap.add_argument("--rollout-tokens", type=int, default=64, help="rollout arms: new tokens per rollout")
    ap.add_argument("--max-blocks", type=int, default=256, help="Draft-OPD arms: most replayed blocks per step")
    ap.add_argument("--lr-sft", type=float, default=1e-3, help="continued SFT's peak LR")
    ap.add_argument("--lr-opd", type=float, default=3e-4, help="Draft-OPD and sequential OPD's peak LR")
    ap.add_argument("--lr-specopd", type=float, default=None, help="SpecOPD's peak LR (default: its recipe's)")
    ap.add_argument("--eval-limit", type=int, default=MIN_EVAL_PROMPTS, help="held-out prompts per domain")
    ap.add_argument("--eval-split", choices=("eval", "validation"), default="eval",
                    help="measure on the held-out EVAL split (the comparison) or on VALIDATION prompts (train-split "
                         "prompts [--val-offset, --val-offset + --eval-limit) per domain, outside the references): "
                         "the tuning sweep chooses settings there, never on the eval split")
    ap.add_argument("--val-offset", type=int, default=100, help="first train-split prompt per domain of validation")
    ap.add_argument("--eval-max-new-tokens", type=int, default=96)
    ap.add_argument("--eval-concurrency", type=int, default=8)
    ap.add_argument("--server-threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=31410)
    ap.add_argument("--progress-every-s", type=float, default=60.0, help="training progress line every N s")
    ap.add_argument("--live-traffic-result", default="benchmarks/results/draft_opd_live_traffic_smollm2_cpu.json",
                    help="copy its live_traffic numbers into the result when the file exists")
    ap.add_argument("--redo", action="store_true", help="retrain the selected arms even if finished")
    ap.add_argument("--fresh", action="store_true", help="remove the run directory's arms and setup first")
    ap.add_argument("--merge-only", action="store_true", help="write the result from the finished arms only")
    ap.add_argument("--restore-from", default=None, metavar="RESULT",
                    help="first seed the run directory with the arms of a committed result file of this comparison "
                         "(same start, budget, evaluation and references; arms already in the run directory win)")
    return ap.parse_args(argv)


def check_options(args) -> list:
    """The selected arms; raises CompareError / ArmsError for options that cannot make a run."""
    arms = select_arms(args.arms)
    start = Path(args.start).expanduser()
    if not (start / "config.json").is_file() or not (start / "model.safetensors").is_file():
        raise CompareError(f"--start {args.start}: not a drafter directory (config.json + model.safetensors)")
    require_at_least(args, 1, "budget_tokens", "eval_limit", "rollout_prompts", "max_blocks", "refs_per_domain",
                     "eval_concurrency")
    require_at_least(args, 2, "rollout_tokens", "eval_max_new_tokens")
    if args.lr_specopd is not None and args.lr_specopd <= 0:
        raise CompareError(f"--lr-specopd must be > 0, got {args.lr_specopd}")
    if args.eval_split == "validation":
        val = (args.val_offset, args.val_offset + args.eval_limit)
        refs = (args.refs_offset, args.refs_offset + args.refs_per_domain)
        if args.val_offset < 0 or (val[0] < refs[1] and refs[0] < val[1]):
            raise CompareError(f"validation prompts [{val[0]}, {val[1]}) overlap the training references "
                               f"[{refs[0]}, {refs[1]}) (or start below 0): choose another --val-offset")
    return arms


def setup_of(args, start_sha: str) -> dict:
    """What every merged arm must share (``setup.json``)."""
    return {"start_sha256": start_sha, "budget_tokens": args.budget_tokens, "config": args.config,
            "eval_limit": args.eval_limit, "eval_max_new_tokens": args.eval_max_new_tokens,
            "refs_offset": args.refs_offset, "refs_per_domain": args.refs_per_domain,
            "rollout_prompts": args.rollout_prompts, "rollout_tokens": args.rollout_tokens,
            "max_blocks": args.max_blocks, "lr_sft": args.lr_sft, "lr_opd": args.lr_opd,
            # keys of later options only when set, so run directories made before them still match
            **({"eval_split": "validation", "val_offset": args.val_offset} if args.eval_split == "validation"
               else {}),
            **({"lr_specopd": args.lr_specopd} if args.lr_specopd is not None else {})}


def main(argv=None) -> int:
    from draft_opd_compare.cli import script_main
    from sglang_specopd.app.launch.process import ServeError

    return script_main("draft_opd_smollm2", argv, parse_args, check_options, run,
                       (CompareError, ArmsError, SetupMismatchError, ServeError))


def run(args, arms: list) -> int:
    from draft_opd_compare.store import check_setup, finished_arms, restore_arms, save_arm
    from draft_opd_compare.train import pooled_tau, run_arm

    from sglang_specopd.app.models import sha256_file

    run_dir = Path(args.run_dir)
    if args.fresh:
        shutil.rmtree(run_dir / "arms", ignore_errors=True)
        (run_dir / "setup.json").unlink(missing_ok=True)
    start = Path(args.start).expanduser().resolve()
    start_sha = sha256_file(start / "model.safetensors")
    setup = setup_of(args, start_sha)
    check_setup(run_dir, setup)
    if args.restore_from:
        path = Path(args.restore_from)
        if not path.is_file():
            raise CompareError(f"--restore-from {args.restore_from}: no such result file")
        restored = restore_arms(run_dir, json.loads(path.read_text()), setup)
        print(f"draft_opd_smollm2: restored {restored or '(none)'} from {path}", file=sys.stderr)
    done = finished_arms(run_dir)
    todo = [] if args.merge_only else [a for a in arms if args.redo or a not in done]
    print(f"draft_opd_smollm2: arms to run {todo or '(none)'}; finished {sorted(done)}", file=sys.stderr)
    if todo:
        with open_session(args, start, run_dir) as session:
            for arm in todo:
                start_rows = finished_arms(run_dir).get("sft_start", {}).get("per_request", {}).get("T1")
                session.start_tau = pooled_tau(start_rows) if start_rows else None  # sizes the sequential arm
                save_arm(run_dir, arm, run_arm(session, arm))
    return write(args, start, start_sha, finished_arms(run_dir))


@contextlib.contextmanager
def open_session(args, start: Path, run_dir: Path):
    """The SPECOPD server serving the start drafter (admin key), the references generated through it (cached in
    ``--refs-dir``), and the :class:`draft_opd_compare.train.Session` every arm uses; stops the server on exit."""
    import os

    import torch
    from transformers import AutoTokenizer

    from draft_opd_compare.train import Session
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.serve.spec import config_path, launch_spec
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.pipeline import prepare_sequences, train_split_records

    torch.set_num_threads(2)
    os.environ["SPECOPD_CPU_SERVER_THREADS"] = str(args.server_threads)  # read by launch.server_env on CPU
    cfg = ServeConfig.load(config_path(args.config))
    if cfg.speculative_algorithm != "SPECOPD":
        raise CompareError(f"--config {args.config} runs {cfg.speculative_algorithm}: the arms need SPECOPD")
    spec = launch_spec(cfg, port=args.port, drafter=str(start), admin_api_key=ADMIN_KEY)
    tok = AutoTokenizer.from_pretrained(spec.model_path)
    base = DFlashDrafter.from_pretrained(start, spec.model_path)
    with SGLangServer(spec) as server, SpecOPDClient(server.url, admin_api_key=ADMIN_KEY) as client:
        print(f"server {server.url} up; references in {args.refs_dir}", file=sys.stderr)
        hold, train = prepare_sequences(client, tok, list(base.spec.target_layer_ids), Path(args.refs_dir),
                                        max_new_tokens=args.refs_max_new_tokens,
                                        records=train_split_records(args.refs_offset, args.refs_per_domain))
        seqs = hold + train  # none held out: evaluation uses the eval split
        yield Session(url=server.url, admin_key=ADMIN_KEY, client=client, tok=tok, base=base, train_seqs=seqs,
                      prompts=[x.token_ids[:x.prompt_len].tolist() for x in seqs], budget_tokens=args.budget_tokens,
                      args=args, run_dir=run_dir, domains=DOMAINS)


def write(args, start: Path, start_sha: str, results: dict) -> int:
    """Merge the finished arms into the result file and its plot."""
    from draft_opd_compare.plot import save_plot
    from draft_opd_compare.arms import ARMS
    from draft_opd_compare.store import assemble, floors, missing_arms

    from sglang_specopd.app.results import write_result

    if not results:
        print("draft_opd_smollm2: no finished arm to report", file=sys.stderr)
        return 1
    measured = assemble(results, DOMAINS)
    payload = {
        "target": "SmolLM2-135M-Instruct" if args.config == "cpu-smollm2" else args.config,
        "start": {"path": str(start), "sha256": start_sha},
        **measured,
        "budget_target_tokens": args.budget_tokens,
        "budget_fraction": {a: r.get("budget_fraction") for a, r in results.items()},
        "steps": {a: r.get("steps") for a, r in results.items()},
        "topups": {a: r.get("topups") for a, r in results.items() if "topups" in r},
        "configs": {a: r.get("config") for a, r in results.items()},
        "eval": {"limit_per_domain": args.eval_limit, "max_new_tokens": args.eval_max_new_tokens,
                 "temperatures": [0.0, 1.0], "split": args.eval_split,
                 **({"offset": args.val_offset} if args.eval_split == "validation" else {}),
                 "meets_24_prompt_rule": args.eval_split == "eval" and args.eval_limit >= MIN_EVAL_PROMPTS},
        "lr": {"sft_continued": args.lr_sft, "opd": args.lr_opd, "specopd": args.lr_specopd or "recipe"},
        "references": {"dir": args.refs_dir, "split": "train", "offset": args.refs_offset,
                       "per_domain": args.refs_per_domain},
        "server": {"config": args.config, "cpu_threads": args.server_threads},
        "floors": floors(measured),
        "missing_arms": missing_arms(ARMS, results),
        "per_request": {a: r["per_request"] for a, r in results.items()},
    }
    live = Path(args.live_traffic_result)
    if live.is_file():  # the live-traffic run (benchmarks/live_traffic/run.py) is a separate measurement
        payload["live_traffic"] = {**json.loads(live.read_text()).get("live_traffic", {}), "source": str(live)}
    out = write_result(args.out, payload, command=args.command)
    save_plot(measured, out.with_suffix(".png"))
    for a in measured["arms"]:
        t0, d = measured["acceptance"][a]["T0"], measured["paired_diff_vs_sft_continued"].get(a, {}).get("T0", {})
        diff = (f", vs continued SFT {d['mean']:+.3f} {[round(x, 3) for x in d['ci95']]}"
                f"{' (inside the noise)' if d['inside_noise'] else ''}") if "mean" in d else ""
        print(f"{a}: T0 tau {t0.get('mean', float('nan')):.3f} {t0.get('ci95')}{diff}", file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
