"""The phases of one architecture (:mod:`.store` lists them), each returning the record the run directory keeps.

Training uses the project's own loops (``train_sft``, ``train_specopd``); evaluation is SGLang's per-request
statistics on the held-out prompts (``evaluate_acceptance``) on a server of that architecture (``specopd serve``'s
launch: SPECOPD for dflash / dflash2 drafters, SPECOPD_DSPARK for dspark ones), each drafter pushed into it hot
before it is measured; serving throughput is ``specopd bench serve --launch-baseline`` in a subprocess.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from drafter_archs.store import TEMPERATURES, TEMPS, arch_dir, drafter_dir, load_phase, save_phase

ADMIN_KEY = "specopd-bench-admin"


@dataclass
class Context:
    """What every phase shares: the script's options (``args``), the run directory, the target (its directory and
    tokenizer), the context-layer ids of the reference sizes, a logger, and the loaded data (``data``: SFT
    sequences, SpecOPD references, their stats; None until a phase needs it)."""

    args: Any
    run_dir: Path
    target: str
    tok: Any
    layer_ids: list
    log: Callable[[str], None] = field(default=lambda m: print(m, file=sys.stderr, flush=True))
    data: Optional[tuple] = None
    rest_s: Callable[[], float] = field(default=lambda: 0.0)  # seconds of the other unfinished phases (ETA)


def drafter_class(arch: str):
    from specopd_trainer.drafters.registry import get_drafter_class

    return get_drafter_class(arch)


def load_drafter(ctx: Context, arch: str, stage: str):
    return drafter_class(arch).from_pretrained(drafter_dir(ctx.run_dir, arch, stage), ctx.target)


def run_init(ctx: Context, arch: str) -> Dict[str, Any]:
    """A fresh drafter of ``arch`` with the reference sizes (``args.sizes``: block size, layers, context layers,
    mask token) and ``--seed``; records its parameter counts (checkpoint tensors, and trainable ones: the target's
    frozen embedding / LM head excluded) and spec."""
    from safetensors import safe_open

    from sglang_specopd.wire.drafters.archs import load_drafter_spec, spec_as_dict
    from sglang_specopd.wire.drafters.init import init_drafter

    t0 = time.monotonic()
    out = drafter_dir(ctx.run_dir, arch, "init")
    s = ctx.args.sizes
    init_drafter(ctx.target, out, block_size=s["block_size"], num_layers=s["num_layers"], seed=ctx.args.seed,
                 mask_token=s["mask_token"], target_layer_ids=s["target_layer_ids"], arch=arch, overwrite=True)
    with safe_open(str(out / "model.safetensors"), "pt") as fh:
        ckpt = sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())
    drafter = drafter_class(arch).from_pretrained(out, ctx.target)
    trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    return {"drafter": str(out), "params": {"checkpoint": int(ckpt), "trainable": int(trainable)},
            "spec": spec_as_dict(load_drafter_spec(out)), "wall_s": time.monotonic() - t0}


def run_sft(ctx: Context, arch: str) -> Dict[str, Any]:
    """SFT from the init drafter on the SFT sequences: ``ceil(--sft-tokens / (seqs x anchors x G))`` steps, cosine
    schedule, checkpoints every ``--ckpt-every`` steps (a killed phase resumes there, exactly). Records nominal
    supervised tokens (steps x seqs x anchors x G), steps, cumulative wall time, final loss, config."""
    from drafter_archs.eta import steps_of, training_ticker
    from specopd_trainer.algorithms.sft.config import SFTConfig
    from specopd_trainer.algorithms.sft.loop import train_sft

    a = ctx.args
    drafter = load_drafter(ctx, arch, "init")
    g = drafter.block_size - 1
    steps = steps_of("sft", a)
    cfg = SFTConfig(steps=steps, lr=a.sft_lr, seqs_per_step=a.sft_seqs_per_step, anchors_per_seq=a.sft_anchors_per_seq,
                    warmup_steps=min(30, max(1, steps // 20)), log_every=1, ckpt_every=a.ckpt_every,
                    eval_every=10**9, seed=a.seed)
    run = arch_dir(ctx.run_dir, arch) / "sft"
    with training_ticker(ctx.log, f"{arch} sft", run, steps, ctx.rest_s, a.progress_every_s):
        summary = train_sft(drafter, list(ctx.data[0]), [], run, cfg, progress=False)
    out = drafter_dir(ctx.run_dir, arch, "sft")
    drafter.save_pretrained(out, overwrite=True)
    return {"drafter": str(out), "steps": summary["steps"],
            "supervised_tokens": summary["steps"] * a.sft_seqs_per_step * a.sft_anchors_per_seq * g,
            "wall_s": summary["wall_s"], "final_loss": summary.get("loss"), "config": cfg.model_dump(),
            "data": ctx.data[2]}


def run_specopd(ctx: Context, arch: str, client) -> Dict[str, Any]:
    """SpecOPD from the SFT drafter on the references against the architecture's server (``score_trees``), the
    validated recipe at ``--opd-tokens`` (``draft_opd_compare.arms.specopd_recipe_config``), checkpoints every
    ``--ckpt-every`` steps (resumes). Records supervised tokens (counted by the loop), steps, wall time, config."""
    from draft_opd_compare.arms import specopd_recipe_config
    from drafter_archs.eta import training_ticker
    from specopd_trainer.algorithms.specopd.loop import train_specopd

    a = ctx.args
    drafter = load_drafter(ctx, arch, "sft")
    cfg = specopd_recipe_config(a.opd_tokens, drafter.block_size - 1, lr=a.opd_lr)
    cfg = cfg.model_copy(update={"ckpt_every": a.ckpt_every, "seed": a.seed})
    run = arch_dir(ctx.run_dir, arch) / "specopd"
    client.prefix_cache(clear=True)
    with training_ticker(ctx.log, f"{arch} specopd", run, cfg.steps, ctx.rest_s, a.progress_every_s):
        summary = train_specopd(drafter, client, list(ctx.data[1]), run, cfg, progress=False)
    out = drafter_dir(ctx.run_dir, arch, "specopd")
    drafter.save_pretrained(out, overwrite=True)
    return {"drafter": str(out), "steps": summary["steps"], "supervised_tokens": summary["supervised_tokens"],
            "wall_s": summary["wall_s"], "final_loss": summary.get("loss"), "config": cfg.model_dump()}


def run_eval(ctx: Context, arch: str, phase: str, stage: str, url: str) -> Dict[str, Any]:
    """Push the ``stage`` drafter hot as version ``<arch>-<stage>`` and evaluate it on the held-out prompts
    (``--eval-limit`` per domain, ``--eval-max-new-tokens``) at T0 then T1; each finished temperature is kept
    (``<phase>.<T>.json``) so a resumed run measures only the missing one. Records per-request rows per temperature
    and the summed wall time."""
    from specopd_trainer.evaluate import evaluate_acceptance
    from specopd_trainer.pipeline import push_drafter

    a = ctx.args
    version = f"{arch}-{stage}"
    push_drafter(url, load_drafter(ctx, arch, stage), version, ADMIN_KEY)
    rows, wall = {}, 0.0
    for t in TEMPS:
        part = load_phase(ctx.run_dir, arch, phase, t)
        if part is None:
            t0 = time.monotonic()
            res = evaluate_acceptance(url, ctx.tok, list(a.domains), temperature=TEMPERATURES[t], limit=a.eval_limit,
                                      max_new_tokens=a.eval_max_new_tokens, concurrency=a.eval_concurrency,
                                      progress=False)
            part = {"per_request": res["per_request"], "wall_s": time.monotonic() - t0, "version": version}
            save_phase(ctx.run_dir, arch, phase, part, temp=t)
            ctx.log(f"[{arch} {phase}] {t}: tau {json.dumps({d: round(v, 3) for d, v in res['tau'].items() if v})} "
                    f"mean {res['mean_tau']:.3f} ({part['wall_s']:.0f} s)")
        rows[t], wall = part["per_request"], wall + part["wall_s"]
    return {"per_request": rows, "wall_s": wall, "version": version}


@contextlib.contextmanager
def arch_server(ctx: Context, arch: str, stage: str):
    """The architecture's server (``--config``, admin key) started with its ``stage`` drafter; yields (url,
    client); stops it on exit. Log: ``RUN/<arch>/logs/server.log``."""
    from sglang_specopd.app.launch.process import SGLangServer, free_port
    from sglang_specopd.app.serve.spec import launch_spec
    from specopd_trainer.client.http import SpecOPDClient

    cfg = load_config(ctx.args)
    spec = launch_spec(cfg, port=ctx.args.port or free_port(), drafter=str(drafter_dir(ctx.run_dir, arch, stage)),
                       admin_api_key=ADMIN_KEY)
    log = arch_dir(ctx.run_dir, arch) / "logs" / "server.log"
    ctx.log(f"[{arch}] starting the {spec.speculative_algorithm} server with drafter-{stage}; log {log}")
    with SGLangServer(spec, log_path=log) as server, SpecOPDClient(server.url, admin_api_key=ADMIN_KEY) as client:
        yield server.url, client


@contextlib.contextmanager
def data_server(ctx: Context):
    """A plain server of ``--config``'s target (no drafter) for generating references and fetching features."""
    from sglang_specopd.app.launch.process import SGLangServer, free_port
    from sglang_specopd.app.serve.spec import launch_spec
    from specopd_trainer.client.http import SpecOPDClient

    cfg = load_config(ctx.args).model_copy(update={"drafter": None, "speculative_algorithm": None})
    spec = launch_spec(cfg, port=ctx.args.port or free_port())
    log = Path(ctx.run_dir) / "data" / "server.log"
    ctx.log(f"starting a plain server for the training data; log {log}")
    with SGLangServer(spec, log_path=log) as server, SpecOPDClient(server.url) as client:
        yield client


def load_config(args):
    """``--config`` with ``score_trees_budget_tokens`` 0: the phases never serve while they score (training and
    evaluation take turns), so each ``score_trees`` call runs whole rather than in 64-row pieces between decode
    steps, which the CPU configs set to protect live serving latency (the trainer gets ~2.3x the supervised tokens/s
    at 256 rows, server_configs/cpu-smollm2.yaml). ``bench serve`` launches the config as it is."""
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.serve.spec import config_path

    return ServeConfig.load(config_path(args.config)).model_copy(update={"score_trees_budget_tokens": 0})


def bench_serve(cmd: list, env: dict) -> int:
    """Run one ``specopd bench serve`` command line in a subprocess; its exit status (the seam tests replace)."""
    return subprocess.run(cmd, env=env).returncode


def run_serve(ctx: Context, arch: str) -> Dict[str, Any]:
    """``specopd bench serve --launch CONFIG --launch-baseline --drafter RUN/<arch>/drafter-specopd`` at
    ``--serve-concurrency`` on ``--serve-limit`` held-out prompts per domain (raw payload in
    ``RUN/<arch>/serve/T<t>.json``, reused when present); records the levels as
    ``concurrency_reference.summarize`` gives them (output tokens/s of both servers, speedup, tau with intervals)."""
    from concurrency_reference.run import summarize

    a = ctx.args
    out = arch_dir(ctx.run_dir, arch) / "serve"
    key = f"T{a.serve_temperature:g}"
    raw = out / f"{key}.json"
    drafter = drafter_dir(ctx.run_dir, arch, "specopd")
    t0 = time.monotonic()
    if not raw.is_file():
        cmd = [sys.executable, "-m", "sglang_specopd.app.cli", "bench", "serve", "--launch", a.config,
               "--launch-baseline", "--drafter", str(drafter), "--concurrency", ",".join(map(str, a.serve_levels)),
               "--limit", str(a.serve_limit), "--max-new-tokens", str(a.serve_max_new_tokens),
               "--domains", ",".join(a.domains), "--temperature", f"{a.serve_temperature:g}", "--out", str(raw),
               "--log-dir", str(out / "logs")]
        ctx.log("+ " + " ".join(cmd))
        env = {**os.environ, "SPECOPD_CPU_SERVER_THREADS": str(a.server_threads)}
        if bench_serve(cmd, env) != 0 or not raw.is_file():
            raise RuntimeError(f"bench serve for {arch} failed (see {out / 'logs'})")
    levels = summarize({key: json.loads(raw.read_text())}, list(a.domains))[key]
    return {"drafter": str(drafter), "levels": levels, "raw": str(raw), "temperature": a.serve_temperature,
            "limit_per_domain": a.serve_limit, "max_new_tokens": a.serve_max_new_tokens,
            "wall_s": time.monotonic() - t0}
