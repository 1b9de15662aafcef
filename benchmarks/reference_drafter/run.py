"""The reference drafter for the CPU default (SmolLM2-135M-Instruct): corpus at scale, SFT to the plateau, ship.

Stages (each resumable; run them in order, one at a time, on a quiet machine for the timings to mean anything):

    python benchmarks/reference_drafter/run.py collect --servers 2   # ~2M target tokens through live plain servers
    python benchmarks/reference_drafter/run.py sft --steps 6000   # resumes; held-out walk tau logged every eval_every
    python benchmarks/reference_drafter/run.py report    # serve it, held-out tau at T0/T1 with intervals
    python benchmarks/reference_drafter/run.py ship      # into sglang_specopd/assets/drafters (bf16) + training record

``collect`` regenerates the corpus of :mod:`specopd_trainer.data.corpus` (every train prompt of the four domains,
extra T=0.8 samples for dialogue and agentic) at ``--concurrency`` requests in flight per server through
``--servers`` replicas (:class:`specopd_trainer.client.pool.ClientPool`; on the 2-core CPU machine two 1-thread
replicas decode ~2x one 2-thread server), appends each response to
``RUN/data/responses.jsonl`` as it finishes (first importing the responses committed in ``benchmarks/data/
reference_corpus/`` and afterwards adding a shard of the new ones there: commit it, so a new machine resumes
rather than regenerates; ``snapshot`` does only that), then fetches the drafter's context features through
``/specopd/score_trees`` into ``RUN/data/features/`` shards (both resume). It writes
``benchmarks/results/reference_corpus_smollm2_cpu.json``: tokens per domain, generation and feature tokens/s,
and where the time went.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Optional

DOMAINS = ["dialogue", "coding", "math", "agentic"]
RUN = Path("runs/reference_drafter")
RESULTS = Path("benchmarks/results")
SNAPSHOT = Path("benchmarks/data/reference_corpus")  # committed gzip shards of the responses (data/snapshot.py)


def _corpus_stats(responses: Path) -> dict:
    from specopd_trainer.collect import iter_responses

    per = defaultdict(lambda: {"responses": 0, "prompt_tokens": 0, "response_tokens": 0, "length_capped": 0})
    for r in iter_responses(responses):
        d = per[r.domain]
        d["responses"] += 1
        d["prompt_tokens"] += len(r.prompt_ids)
        d["response_tokens"] += len(r.response_ids)
        d["length_capped"] += int(r.finish_reason == "length")
    return dict(per)


class _UntilDeadline:
    """The records, with a length (for the ETA), that stop being handed out at ``deadline`` (time.monotonic())."""

    def __init__(self, records: list, deadline: float | None):
        self.records, self.deadline = records, deadline

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        for r in self.records:
            if self.deadline is not None and time.monotonic() > self.deadline:
                print("generation time budget reached: no new requests (in-flight ones finish)", file=sys.stderr)
                return
            yield r


def init_drafter_dir(run: Path, target: str, block_size: int = 8) -> Path:
    """The fresh 2-layer DFlash drafter every stage starts from (created once, seed 0): block 8, the shipped one's,
    unless ``block_size`` says otherwise (``drafter-init-b<B>``; issue 42's short-block drafters)."""
    from sglang_specopd.wire.drafters.init import init_drafter

    d = run / ("drafter-init" if block_size == 8 else f"drafter-init-b{block_size}")
    if not (d / "model.safetensors").is_file():
        init_drafter(target, d, block_size=block_size, num_layers=2, seed=0, overwrite=True)
    return d


def collect(args) -> int:
    from transformers import AutoTokenizer

    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.models import prepare_model
    from sglang_specopd.app.results import write_result
    from sglang_specopd.app.serve.spec import config_path, launch_spec
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.client.pool import ClientPool
    from specopd_trainer.collect import chat_prompt_ids, iter_responses, regenerate
    from specopd_trainer.data.corpus import CorpusSpec, corpus_records, corpus_size
    from specopd_trainer.data.snapshot import import_snapshot, write_shard
    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.features import FeatureStore

    run = Path(args.run_dir)
    data = run / "data"
    data.mkdir(parents=True, exist_ok=True)
    target = prepare_model("smollm2")
    tok = AutoTokenizer.from_pretrained(target)
    layer_ids = list(DFlashDrafter.from_pretrained(init_drafter_dir(run, target), target).spec.target_layer_ids)
    spec = CorpusSpec(math_problems=args.math_problems)
    # this stage owns the machine (run it alone): one server thread per core. Prefill, most of the feature pass,
    # doubles from 1 to 2 threads (cpu_dtype_cpu.json: 253 -> 505 tok/s); decode at 48 requests did not gain.
    # An explicit SPECOPD_CPU_SERVER_THREADS / OMP_NUM_THREADS wins.
    # With --servers N (replicas, each its own port), each replica gets cpu_count // N threads.
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ.setdefault("SPECOPD_CPU_SERVER_THREADS", str(max(1, (os.cpu_count() or 1) // args.servers)))
    # the feature pass is this server's only work: score each batch whole, not in 64-row pieces between decode
    # steps (the interleaving that protects serving latency, docs/score_trees.md)
    plain = ServeConfig.load(config_path(args.config)).model_copy(update={"score_trees_budget_tokens": 0})
    timings = {}
    records = list(corpus_records(spec))
    if not args.no_snapshot:  # the responses earlier sessions committed: never generated twice
        t1 = time.monotonic()
        got = import_snapshot(SNAPSHOT, data / "responses.jsonl", {r["id"]: r for r in records},
                              lambda r: chat_prompt_ids(tok, r["messages"]))
        timings["snapshot_import_s"] = time.monotonic() - t1
        print(f"snapshot {SNAPSHOT}: {got}", file=sys.stderr)
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(SGLangServer(launch_spec(plain, port=args.port + i)))
                   for i in range(args.servers)]
        # a response of max_new_tokens in a batch of --concurrency can take longer than the client's default
        # 600 s on a contended CPU (~0.5 tok/s per request at 25 tok/s per server); a timed-out request is retried
        # from scratch, so the timeout must cover the slowest response, not the typical one
        clients = [stack.enter_context(SpecOPDClient(s.url, timeout=args.request_timeout)) for s in servers]
        client, pool = clients[0], ClientPool(clients)
        timings["server_start_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        deadline = t1 + 60 * args.generate_minutes if args.generate_minutes is not None else None  # 0: features only
        try:
            cache = regenerate(pool, tok, _UntilDeadline(records, deadline), data / "responses.jsonl",
                               max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                               concurrency=args.concurrency * args.servers)
        finally:  # an aborted run's responses go into a shard too
            if not args.no_snapshot and (shard := write_shard(data / "responses.jsonl", SNAPSHOT)):
                print(f"new snapshot shard {shard} (commit it: the next machine starts from it)", file=sys.stderr)
        timings["responses_per_server"] = pool.served
        timings["generate_s"] = time.monotonic() - t1
        t1 = time.monotonic()
        added, feat_tokens = 0, 0
        if not args.no_features:
            store = FeatureStore(data / "features", layer_ids)
            feat_tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in iter_responses(data / "responses.jsonl")
                              if r.id not in store)
            added = store.build(client, iter_responses(data / "responses.jsonl"), batch=args.feature_batch)
        timings["features_s"] = time.monotonic() - t1
    stats = _corpus_stats(data / "responses.jsonl")
    payload = {
        "target": "SmolLM2-135M-Instruct", "server_config": args.config, "corpus": spec.as_dict(),
        "corpus_records": corpus_size(spec), "per_domain": stats,
        "response_tokens": sum(v["response_tokens"] for v in stats.values()),
        "prompt_tokens": sum(v["prompt_tokens"] for v in stats.values()),
        "this_run": {"new_responses": cache.new, "resumed": cache.resumed, "too_long": cache.too_long,
                     "rejected": cache.rejected, "response_tokens": cache.response_tokens,
                     "generate_tokens_per_s": cache.tokens_per_s, "features_added": added,
                     "feature_tokens": feat_tokens,
                     "feature_tokens_per_s": (feat_tokens / timings["features_s"]) if added else None,
                     "timings_s": timings},
        "concurrency": args.concurrency, "servers": args.servers, "max_new_tokens": args.max_new_tokens, "feature_layer_ids": layer_ids,
        "data_dir": str(data),
        "features_cached": len(FeatureStore(data / "features", layer_ids).index),
    }
    out = RESULTS / "reference_corpus_smollm2_cpu.json"
    write_result(out, payload, command="python " + " ".join(sys.argv))
    print(json.dumps({k: payload[k] for k in ("response_tokens", "prompt_tokens")} | payload["this_run"], indent=1),
          file=sys.stderr)
    return 0


def snapshot(args) -> int:
    """Write the collected responses that no committed shard holds yet as a new shard (see data/snapshot.py)."""
    from specopd_trainer.data.snapshot import write_shard

    shard = write_shard(Path(args.run_dir) / "data" / "responses.jsonl", SNAPSHOT)
    print(f"new shard {shard} ({shard.stat().st_size} bytes)" if shard else "nothing new to snapshot", file=sys.stderr)
    return 0


def holdout_ids(ids, fraction: float = 0.03, cap: int = 64) -> set:
    """Training sequences held out for the walk-tau curve: a stable hash of the id below ``fraction`` (so the set
    does not move when the corpus grows between sessions), at most ``cap`` of them (smallest hashes)."""
    import hashlib

    def h(i):
        return int.from_bytes(hashlib.sha256(f"holdout:{i}".encode()).digest()[:8], "big") / 2 ** 64

    picked = sorted((h(i), i) for i in ids if h(i) < fraction)
    return {i for _, i in picked[:cap]}


def sft(args) -> int:
    """SFT on the corpus collected so far; resumes from RUN/sft (the schedule is over ``--steps``)."""
    from sglang_specopd.app.models import prepare_model
    from specopd_trainer.algorithms.sft.config import SFTConfig
    from specopd_trainer.algorithms.sft.loop import train_sft
    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.features import FeatureStore

    run = Path(args.run_dir)
    target = prepare_model("smollm2")
    drafter = DFlashDrafter.from_pretrained(init_drafter_dir(run, target, args.block_size), target)
    store = FeatureStore(run / "data" / "features", list(drafter.spec.target_layer_ids))
    held = holdout_ids(store.index)
    seqs = store.load()
    train = [s for s in seqs if s.id not in held]
    holdout = sorted((s for s in seqs if s.id in held), key=lambda s: s.id)
    tokens = sum(len(s.token_ids) - s.prompt_len for s in train)
    print(f"SFT on {len(train)} sequences ({tokens} response tokens), {len(holdout)} held out", file=sys.stderr)
    cfg = SFTConfig(steps=args.steps, max_minutes=args.minutes, lr=args.lr, seqs_per_step=args.seqs_per_step,
                    anchors_per_seq=args.anchors_per_seq, eval_every=args.eval_every,
                    eval_sequences=min(args.eval_sequences, max(1, len(holdout))), ckpt_every=args.ckpt_every)
    summary = train_sft(drafter, train, holdout, run / "sft", cfg)
    drafter.save_pretrained(run / "drafter-sft", overwrite=True)
    (run / "sft" / "corpus.json").write_text(json.dumps({"train_sequences": len(train), "train_response_tokens": tokens,
                                                         "sft_command": "python " + " ".join(sys.argv),
                                                         "holdout": sorted(held)}, indent=1))
    print(json.dumps({k: summary[k] for k in ("steps", "wall_s", "train_tokens") if k in summary}), file=sys.stderr)
    return 0


def plateau(run: Path) -> list:
    """[{"step", "walk_tau", "loss"}] from RUN/sft/metrics.jsonl at every step where the held-out walk tau was
    measured (the engine logs the latest value with each step's metrics)."""
    path = run / "sft" / "metrics.jsonl"
    out, last = [], None
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        m = json.loads(line)
        tau = m.get("eval_walk_tau")
        if tau is not None and tau == tau and tau != last:
            out.append({"step": int(m["step"]), "walk_tau": float(tau), "loss": m.get("loss")})
            last = tau
    return out


def trained_steps(run: Path) -> Optional[int]:
    """The steps the SFT drafter trained: its newest checkpoint ``RUN/sft/checkpoints/step-N.pt``, else the last step
    RUN/sft/metrics.jsonl logged (it logs every few steps), None without either."""
    ckpts = sorted((run / "sft" / "checkpoints").glob("step-*.pt"))
    if ckpts:
        return int(ckpts[-1].stem.split("-")[1])
    path = run / "sft" / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return int(json.loads(lines[-1])["step"]) if lines else None


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def report(args) -> int:
    """Serve the SFT drafter (the default bf16 config) and measure held-out tau at T0 and T1 with intervals."""
    from transformers import AutoTokenizer

    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer
    from sglang_specopd.app.models import prepare_model
    from sglang_specopd.app.results import write_result
    from sglang_specopd.app.serve.spec import config_path, launch_spec
    from specopd_trainer.evaluate import evaluate_acceptance
    from specopd_trainer.intervals import acceptance_intervals

    run = Path(args.run_dir)
    ddir = Path(args.drafter) if args.drafter else run / "drafter-sft"
    target = prepare_model("smollm2")
    tok = AutoTokenizer.from_pretrained(target)
    cfg = ServeConfig.load(config_path(args.config))
    block = json.loads((ddir / "config.json").read_text())["dflash_config"]["block_size"]
    if cfg.block_size != block:  # a short-block drafter (issue 42) is served at its own block size
        cfg = cfg.model_copy(update={"block_size": block})
    acceptance, raw = {}, {}
    with SGLangServer(launch_spec(cfg, port=args.port, drafter=str(ddir))) as server:
        for temp, key in ((0.0, "T0"), (1.0, "T1")):
            res = evaluate_acceptance(server.url, tok, DOMAINS, temperature=temp, limit=args.eval_limit,
                                      max_new_tokens=args.eval_max_new_tokens, concurrency=args.concurrency)
            acceptance[key] = acceptance_intervals(res["per_request"], DOMAINS)
            raw[key] = res["per_request"]
            print(f"{key}: mean {acceptance[key]['mean']:.3f} ci95 {acceptance[key]['ci95']}", file=sys.stderr)
    corpus = json.loads((run / "sft" / "corpus.json").read_text()) if (run / "sft" / "corpus.json").is_file() else {}
    curve = plateau(run)
    spec = json.loads((ddir / "config.json").read_text())
    payload = {
        "target": "SmolLM2-135M-Instruct", "server_config": args.config,
        "train_tokens": corpus.get("train_response_tokens"), "train_sequences": corpus.get("train_sequences"),
        "steps": trained_steps(run), "acceptance": acceptance, "plateau": curve,
        "eval_prompts_per_domain": acceptance["T0"]["prompts"], "eval_max_new_tokens": args.eval_max_new_tokens,
        "drafter": {"path": str(ddir), "sha256": _sha256(ddir / "model.safetensors"),
                    "block_size": spec["dflash_config"]["block_size"], "num_layers": spec["num_hidden_layers"]},
        "per_request": raw,
    }
    out = Path(args.out) if args.out else RESULTS / "reference_drafter_smollm2_cpu.json"
    write_result(out, payload, command="python " + " ".join(sys.argv))
    _plot_plateau(curve, acceptance, out.with_suffix(".png"), payload["steps"])
    return 0


def replot(args) -> int:
    """Redraw the plateau PNG from the committed result file (no serving, no training)."""
    out = RESULTS / "reference_drafter_smollm2_cpu.json"
    data = json.loads(out.read_text())
    _plot_plateau(data["plateau"], data["acceptance"], out.with_suffix(".png"), data.get("steps"))
    return 0


def ship(args) -> int:
    """Copy the SFT drafter into the package as the reference drafter of SmolLM2 (bf16) with its training record.

    Writes ``sglang_specopd/assets/drafters/<target>-b<B>/`` (config.json with ``dtype: bfloat16``,
    model.safetensors, training_record.json: command, commit, data, steps and the result file's acceptance),
    checked with ``check_drafter`` against the target before it replaces the previous one (git keeps that).
    Raises SystemExit(2) when the drafter or the report's result file is missing or the copy fails the check.
    """
    import shutil
    import subprocess

    import torch
    from safetensors.torch import load_file, save_file

    from sglang_specopd.app.drafters.check import check_drafter
    from sglang_specopd.app.models import prepare_model
    from sglang_specopd.app.drafters.reference import ASSETS_DIR, RECORD, reference_drafter_name

    run = Path(args.run_dir)
    src = Path(args.drafter) if args.drafter else run / "drafter-sft"
    result = RESULTS / "reference_drafter_smollm2_cpu.json"
    if not (src / "model.safetensors").is_file() or not result.is_file():
        print(f"error: need {src}/model.safetensors and {result} (run sft and report first)", file=sys.stderr)
        return 2
    measured = json.loads(result.read_text())
    if measured.get("drafter", {}).get("sha256") != _sha256(src / "model.safetensors"):
        print(f"error: {result} measured a different drafter than {src}: run report on it first", file=sys.stderr)
        return 2
    target = prepare_model("smollm2")
    cfg = json.loads((src / "config.json").read_text())
    dest = ASSETS_DIR / reference_drafter_name(target, cfg["dflash_config"]["block_size"])
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in load_file(str(src / "model.safetensors")).items()},
              str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps({**cfg, "dtype": "bfloat16"}, indent=2) + "\n")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    corpus = json.loads((RESULTS / "reference_corpus_smollm2_cpu.json").read_text())
    sft_run = json.loads((run / "sft" / "corpus.json").read_text()) if (run / "sft" / "corpus.json").is_file() else {}
    steps = (trained_steps(run) if src == run / "drafter-sft" else None) or measured.get("steps")
    record = {
        "target": measured["target"], "reproduce": [
            "python benchmarks/reference_drafter/run.py collect --servers 2",
            "python benchmarks/reference_drafter/run.py collect --generate-minutes 0  # the context features",
            sft_run.get("sft_command") or f"python benchmarks/reference_drafter/run.py sft --steps {steps}",
            "python benchmarks/reference_drafter/run.py report", "python benchmarks/reference_drafter/run.py ship"],
        "shipped_from_commit": commit, "source_sha256_float32": measured["drafter"]["sha256"],
        "data": {"snapshot": str(SNAPSHOT), "response_tokens": corpus.get("response_tokens"),
                 "train_response_tokens": measured.get("train_tokens"),
                 "train_sequences": measured.get("train_sequences")},
        "steps": steps, "result_file": str(result),
        "served_tau": {k: {"mean": v["mean"], "ci95": v["ci95"]} for k, v in measured["acceptance"].items()},
        "dtype": "bfloat16 (trained in float32; the served configs load it in the server's dtype)",
    }
    (tmp / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    problems = check_drafter(tmp, target)
    if problems:
        print("error: the bf16 copy fails the drafter check:\n" + "\n".join(f"  - {p}" for p in problems),
              file=sys.stderr)
        return 2
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    size = (dest / "model.safetensors").stat().st_size
    print(f"shipped {dest} ({size / 2**20:.1f} MiB): commit it", file=sys.stderr)
    return 0


def _plot_plateau(curve: list, acceptance: dict, path: Path, step: Optional[int] = None) -> None:
    """Held-out walk tau per logged eval step, and the served tau (T0 / T1, 95% CI) at the drafter's ``step``
    (default: the last logged eval step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sglang_specopd.app.results import save_figure

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    if curve:
        ax.plot([c["step"] for c in curve], [c["walk_tau"] for c in curve], marker="o", ms=3,
                label="held-out walk tau (training sequences held out)")
        last = step or curve[-1]["step"]
        for key, color in (("T0", "C1"), ("T1", "C2")):
            a = acceptance[key]
            ax.errorbar([last], [a["mean"]], yerr=[[a["mean"] - a["ci95"][0]], [a["ci95"][1] - a["mean"]]],
                        fmt="s", color=color, capsize=4, label=f"served tau {key} (held-out prompts, 95% CI)")
    ax.set_xlabel("SFT step")
    ax.set_ylabel("tau (tokens / verify)")
    ax.set_title("reference drafter, SmolLM2-135M-Instruct")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="stage", required=True)
    c = sub.add_parser("collect", help="regenerate the corpus and fetch its features (resumes)")
    c.add_argument("--run-dir", default=str(RUN))
    c.add_argument("--config", default="cpu-smollm2-plain", help="server config (the target as served: bf16)")
    c.add_argument("--concurrency", type=int, default=48, help="requests in flight per server")
    c.add_argument("--request-timeout", type=float, default=3600.0,
                   help="seconds one /generate may take before the client retries it")
    c.add_argument("--servers", type=int, default=1,
                   help="replicas of the plain server on ports --port, --port+1, ...: the least-loaded one takes "
                        "each request (on CPU: one per core, as decode does not scale past one thread)")
    c.add_argument("--max-new-tokens", type=int, default=384)
    c.add_argument("--max-prompt-tokens", type=int, default=1536)
    c.add_argument("--math-problems", type=int, default=3000)
    c.add_argument("--feature-batch", type=int, default=8)
    c.add_argument("--port", type=int, default=31400)
    c.add_argument("--generate-minutes", type=float, default=None,
                   help="send no new request after N minutes (resumable: the next run continues; 0: fetch features only)")
    c.add_argument("--no-features", action="store_true", help="generate only; fetch the features in a later run")
    c.add_argument("--no-snapshot", action="store_true",
                   help=f"neither import the committed responses ({SNAPSHOT}) nor add a shard of the new ones")
    sn = sub.add_parser("snapshot", help=f"add the responses no shard holds yet to {SNAPSHOT} (commit it)")
    sn.add_argument("--run-dir", default=str(RUN))
    t = sub.add_parser("sft", help="SFT on the collected corpus (resumes; schedule over --steps)")
    t.add_argument("--run-dir", default=str(RUN))
    t.add_argument("--steps", type=int, default=20000)
    t.add_argument("--minutes", type=float, default=None, help="stop this session after N minutes (resumable)")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--seqs-per-step", type=int, default=8)
    t.add_argument("--anchors-per-seq", type=int, default=16)
    t.add_argument("--eval-every", type=int, default=200)
    t.add_argument("--eval-sequences", type=int, default=32)
    t.add_argument("--ckpt-every", type=int, default=100)
    t.add_argument("--block-size", type=int, default=8,
                   help="the drafter's block (8: the shipped one's; 4 / 2: issue 42's short-block drafters, trained "
                        "in their own --run-dir holding a link to this run's data/)")
    r = sub.add_parser("report", help="serve the SFT drafter, held-out tau at T0/T1 with intervals, plateau plot")
    r.add_argument("--run-dir", default=str(RUN))
    r.add_argument("--drafter", default=None, help="drafter dir (default RUN/drafter-sft)")
    r.add_argument("--config", default="cpu-smollm2")
    r.add_argument("--eval-limit", type=int, default=24, help="held-out prompts per domain (at least 24)")
    r.add_argument("--eval-max-new-tokens", type=int, default=128)
    r.add_argument("--concurrency", type=int, default=8)
    r.add_argument("--port", type=int, default=31410)
    r.add_argument("--out", default=None, help="result file (default: benchmarks/results/reference_drafter_smollm2_cpu"
                                               ".json)")
    sub.add_parser("replot", help="redraw the plateau plot from the committed result file")
    sh = sub.add_parser("ship", help="copy the reported SFT drafter into the package (bf16) with its record")
    sh.add_argument("--run-dir", default=str(RUN))
    sh.add_argument("--drafter", default=None, help="drafter dir (default RUN/drafter-sft)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(2)
    return {"collect": collect, "sft": sft, "report": report, "snapshot": snapshot, "ship": ship,
            "replot": replot}[args.stage](args)


if __name__ == "__main__":
    sys.exit(main())
