"""Time from launch to healthy of a CPU server, children started by ``spawn`` (SGLang's) vs ``fork`` (the plugin's
CPU adaptation 17, ``sglang_specopd/server/cpu/fork_start.py``), issue 49.

``--rounds`` rounds; each starts one fresh server of ``--config`` per start method (the order reversed every other
round), waits for ``/health_generate``, sends one greedy request (``--max-new-tokens``, ignore_eos) and stops it.
Per method: the launch-to-healthy seconds of each round and their mean; ``fork_over_spawn``: the ratio of the means
with a bootstrap interval over rounds (a round's two starts kept together); ``greedy_identical``: every reply the
same token ids. The machine's load average is recorded: on a busy machine the times are not a result. Writes
``benchmarks/results/server_start_smollm2_<machine kind>.json`` (``--out`` for another config)::

    python benchmarks/server_start/run.py                  # cpu-smollm2, 3 rounds: ~6 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

METHODS = ("spawn", "fork")
RESULT = "benchmarks/results/server_start_smollm2_{kind}.json"  # {kind}: app.results.machine_kind
PROMPT = "The three primary colours are"


def one_start(config: str, method: str, max_new_tokens: int) -> Dict[str, Any]:
    """Start one server of ``config`` with ``method``; its launch-to-healthy seconds and one greedy reply's ids."""
    import httpx

    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer, free_port
    from sglang_specopd.app.serve.spec import config_path, launch_spec
    from sglang_specopd.server.cpu.fork_start import START_METHOD_ENV

    spec = launch_spec(ServeConfig.load(config_path(config)), port=free_port())
    old = os.environ.get(START_METHOD_ENV)
    os.environ[START_METHOD_ENV] = method
    try:
        with SGLangServer(spec) as server:
            r = httpx.post(server.url + "/generate", timeout=300, json={"text": PROMPT, "sampling_params": {
                "max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}})
            r.raise_for_status()
            log = server.log_path.read_text(errors="replace")
            return {"healthy_s": round(float(server.time_to_healthy_s), 2), "output_ids": r.json()["output_ids"],
                    "forked": "start by fork" in log}
    finally:
        if old is None:
            os.environ.pop(START_METHOD_ENV, None)
        else:
            os.environ[START_METHOD_ENV] = old


def ratio_ci(num: Sequence[float], den: Sequence[float], n_boot: int = 2000, seed: int = 0) -> Optional[List[float]]:
    """95% bootstrap interval of mean(num) / mean(den), resampling rounds (pairs kept together); None below 2."""
    pairs = list(zip(num, den))
    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    boots = sorted(sum(x for x, _ in d) / sum(y for _, y in d)
                   for d in ([rng.choice(pairs) for _ in pairs] for _ in range(n_boot)))
    return [round(boots[int(0.025 * n_boot)], 4), round(boots[int(0.975 * n_boot) - 1], 4)]


def summarize(rounds: Sequence[Dict[str, Dict[str, Any]]]) -> Dict[str, Any]:
    """The result's payload from ``rounds`` = [{method: one_start(...)}]."""
    times = {m: [r[m]["healthy_s"] for r in rounds] for m in METHODS}
    replies = {tuple(r[m]["output_ids"]) for r in rounds for m in METHODS}
    return {"healthy_s": times, "healthy_s_mean": {m: round(statistics.mean(v), 2) for m, v in times.items()},
            "fork_over_spawn": round(statistics.mean(times["fork"]) / statistics.mean(times["spawn"]), 4),
            "fork_over_spawn_ci95": ratio_ci(times["fork"], times["spawn"]),
            "forked": {m: [r[m]["forked"] for r in rounds] for m in METHODS},
            "greedy_identical": len(replies) == 1}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-smollm2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--out", default=RESULT, help="result file ({kind}: the machine kind)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    from sglang_specopd.app.results import machine_kind, write_result

    rounds = []
    load_before = os.getloadavg()
    for i in range(args.rounds):
        order = METHODS if i % 2 == 0 else METHODS[::-1]
        rounds.append({m: one_start(args.config, m, args.max_new_tokens) for m in order})
        print(f"round {i + 1}: " + ", ".join(f"{m} {rounds[-1][m]['healthy_s']:.1f} s" for m in METHODS),
              file=sys.stderr)
    payload = {"config": args.config, "rounds": args.rounds, "prompt": PROMPT,
               "max_new_tokens": args.max_new_tokens, **summarize(rounds),
               "load_average": {"before": [round(x, 2) for x in load_before],
                                "after": [round(x, 2) for x in os.getloadavg()]}}
    print(f"launch to healthy: spawn {payload['healthy_s_mean']['spawn']:.1f} s, fork "
          f"{payload['healthy_s_mean']['fork']:.1f} s ({payload['fork_over_spawn']:.2f}x), greedy replies "
          f"{'identical' if payload['greedy_identical'] else 'DIFFERENT'}", file=sys.stderr)
    command = "python " + " ".join(["benchmarks/server_start/run.py", *(argv if argv is not None else sys.argv[1:])])
    write_result(Path(args.out.replace("{kind}", machine_kind())), payload, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
