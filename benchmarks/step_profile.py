"""Where a served decode step's time goes: py-spy on the scheduler of a SPECOPD server (fixed or goodput policy)
and of a plain one, same prompts (issue 42, part 2).

Starts the server of ``--config`` (``--arm plain``: the same config without its drafter), warms it up, then samples
its scheduler process with ``py-spy record --format raw`` for ``--seconds`` while a client keeps ``--concurrency``
greedy requests of ``--max-new-tokens`` in flight (the benchmark's held-out prompts, cycled). Every sampled stack is
put in one bucket (:func:`bucket`): ``target_forward`` (the target model's forward: SGLang's
``TpModelWorker.forward_batch_generation``), ``drafter_forward`` (the draft model runner's forward and the drafter's
head), ``drafter_context_kv`` (target hidden states written into the drafter's context K/V), ``spec_step_other``
(the rest of the DFlash step: block and verify batch building, acceptance, traces), ``scheduler_other`` (batch
scheduling, result processing, output streaming) and ``idle`` (waiting for work). Writes a JSON with the share of
samples per bucket and ms per emitted token per bucket::

    python benchmarks/step_profile.py --arm fixed --out /tmp/profile_fixed.json
    python benchmarks/step_profile.py --arm plain --out /tmp/profile_plain.json

Numbers measured beside other jobs are not results (the file records ``machine.load_avg``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List

import httpx

BUCKETS = ("target_forward", "drafter_forward", "drafter_context_kv", "spec_step_other", "scheduler_other", "idle")
_IDLE = ("recv_pyobj", "recv_requests", "maybe_sleep_on_idle", "_poll", "select (", "sleep (", "wait (threading")


def bucket(stack: str) -> str:
    """The bucket of one py-spy raw stack (frames ``Class.function (file.py:line)`` joined by ``;``, outermost
    first; py-spy shortens SGLang's paths to the file name)."""
    if "TpModelWorker.forward_batch_generation (" in stack:
        return "target_forward"
    if "_append_target_hidden_to_draft_kv_by_loc" in stack:
        return "drafter_context_kv"
    if ("DraftView.forward (" in stack or "_specopd_draft_head" in stack
            or "_greedy_sample_from_vocab_parallel_head" in stack
            or ("DFlashWorkerV2.forward_batch_generation (" in stack and "ModelRunner.forward (" in stack)):
        return "drafter_forward"
    if "DFlashWorkerV2.forward_batch_generation (" in stack:
        return "spec_step_other"
    leaf = stack.rsplit(";", 1)[-1]
    if any(w in leaf for w in _IDLE) or "maybe_sleep_on_idle" in stack:
        return "idle"
    return "scheduler_other"


def summarize(raw_lines: List[str], rate: int, tokens: int) -> Dict:
    """py-spy raw lines (``stack count``) -> {bucket: {share, ms_per_token}} plus totals."""
    counts: Counter = Counter()
    for line in raw_lines:
        stack, _, n = line.rstrip().rpartition(" ")
        if stack and n.isdigit():
            counts[bucket(stack)] += int(n)
    total = sum(counts.values()) or 1
    busy = total - counts["idle"]
    out = {b: {"samples": counts[b], "share_of_busy": (counts[b] / busy if busy and b != "idle" else None),
               "ms_per_token": (1000.0 * counts[b] / rate / tokens) if tokens else None} for b in BUCKETS}
    return {"buckets": out, "samples": total, "busy_samples": busy, "tokens": tokens}


def scheduler_pid(root_pid: int) -> int:
    """The SGLang scheduler process under ``root_pid`` (named ``sglang::scheduler``)."""
    import psutil

    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            if "scheduler" in " ".join(child.cmdline()) or "scheduler" in child.name():
                return child.pid
        except psutil.Error:
            continue
    raise RuntimeError("no sglang::scheduler process found")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-smollm2")
    ap.add_argument("--arm", choices=("fixed", "goodput", "plain"), default="fixed")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--raw", type=Path, default=None, help="also keep py-spy's raw stacks here")
    args = ap.parse_args(argv)

    from sglang_specopd.app.bench.runner import load_prompts
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer, free_port
    from sglang_specopd.app.serve.spec import config_path, launch_spec

    cfg = ServeConfig.load(config_path(args.config))
    update = {"drafter": None, "speculative_algorithm": None} if args.arm == "plain" else {
        "speculative_policy": args.arm}
    cfg = cfg.model_copy(update=update)
    spec = launch_spec(cfg, port=args.port or free_port())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec.model_path)
    prompts = [list(p.prompt_ids) for p in load_prompts(tokenizer, ["dialogue", "coding", "math", "agentic"], 8)[0]]
    params = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    tokens = [0]
    stop = threading.Event()

    with tempfile.TemporaryDirectory() as tmp:
        srv = SGLangServer(spec, log_path=Path(tmp) / "server.log")
        srv.start(timeout=900)
        with srv:
            lines, done, policy = _profile(srv.url, srv.proc.pid, prompts, params, args, tokens, stop, Path(tmp))
    if args.raw is not None:
        args.raw.write_text("\n".join(lines) + "\n")
    result = {"command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
              "arm": args.arm, "config": args.config, "concurrency": args.concurrency, "seconds": args.seconds,
              "machine": {"load_avg": os.getloadavg(), "cpus": os.cpu_count()},
              "profile": summarize(lines, args.rate, done), "policy": policy}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({b: v["share_of_busy"] for b, v in result["profile"]["buckets"].items()}, indent=1))
    return 0


def _profile(url, root_pid, prompts, params, args, tokens, stop, tmp: Path):
    """Client threads + one py-spy recording of the scheduler; (raw lines, tokens emitted, policy stats)."""

    def client(offset: int) -> None:
        i = offset
        with httpx.Client(timeout=600) as c:
            while not stop.is_set():
                try:
                    r = c.post(url + "/generate", json={"input_ids": prompts[i % len(prompts)],
                                                        "sampling_params": params})
                    r.raise_for_status()
                except httpx.HTTPError:
                    if stop.is_set():  # the server is stopping
                        return
                    raise
                if not stop.is_set():
                    tokens[0] += len(r.json()["output_ids"])
                i += args.concurrency

    for p in prompts[:2]:  # warm-up (and the goodput policy's first calibration steps)
        httpx.post(url + "/generate", json={"input_ids": p, "sampling_params": params},
                   timeout=600).raise_for_status()
    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(args.concurrency)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    tokens[0] = 0
    raw = tmp / "raw.txt"
    subprocess.run([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(scheduler_pid(root_pid)),
                    "-d", str(int(args.seconds)), "-r", str(args.rate), "--format", "raw", "-o", str(raw),
                    "--nonblocking"], check=True, capture_output=True)
    done = tokens[0]
    stop.set()
    policy = None
    if args.arm != "plain":
        policy = httpx.get(url + "/specopd/policy", timeout=60).json()
    return raw.read_text().splitlines(), done, policy


if __name__ == "__main__":
    sys.exit(main())
