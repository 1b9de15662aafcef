"""A k = 0 step against a plain decode step at batch 1, 2, 4, 8 (issue 53): ``k0_step_over_plain_step``.

Arms, one server up at a time from ``--config``: plain (no drafter); SPECOPD with the goodput policy forced to k = 0
at every step (a fixed cost curve, no exploration, set through ``POST /specopd/policy``) with k = 0 as SGLang's plain
decode (``k0_plain``, the default) and through the verify path (``k0_verify``, the behaviour before issue 53).
``--rounds`` rounds, each starting a fresh server process per arm, the arm order reversed every other round: one
server process of the same config can differ from another in decode step time by far more than the 3% asked of
a k = 0 step on a 2-core VM (``k0_step_plain_spread`` in the result; py-spy shows a plain step and a k = 0 step
doing the same work, ~96% in the same target forward, docs/goodput.md), so one process per arm measures the
process, not the arm. For each batch size b, ``--waves`` waves of b requests (``--max-new-tokens`` each,
ignore_eos, greedy) run with b in flight after an unmeasured wave; a step's time is the median client inter-token
latency (``_p10``: its 10th percentile; the same measurement for every arm: the plain worker is not instrumented),
and the speculative servers' own mean step time (``GET /specopd/policy``) is kept beside it. The ratio is the mean
over rounds of the arm's step over plain's, with a bootstrap interval over rounds (``_ci95``);
``k0_step_plain_spread`` is the slowest plain process over the fastest. The machine's load average is recorded: on a
busy machine the ratio is not a result.

    python benchmarks/goodput/k0_step.py            # -> benchmarks/results/k0_step_smollm2_<kind>.json
    python benchmarks/goodput/run.py ...   # also records k0_step_over_plain_step (its --k0-waves)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

BATCH_SIZES = (1, 2, 4, 8)
ARMS = ("plain", "k0_plain", "k0_verify")
RESULT = "benchmarks/results/k0_step_smollm2_{kind}.json"  # {kind}: the machine kind (app.results.machine_kind)
ADMIN_KEY = "k0-step-bench"


def forced_k0(gamma: int, plain_k0: bool) -> dict:
    """Policy settings on which k = 0 is optimal at every step (no exploration): the main job's plain arm's."""
    from sglang_specopd.app.main_job.speed import forced_plain

    return forced_plain(gamma, plain_k0)


def _itl_ms(records, q: float) -> Optional[float]:
    """The ``q`` quantile (0.5: the median) of the records' inter-token latencies, in ms."""
    from sglang_specopd.app.bench.metrics import itl_values

    itl = sorted(v for r in records if r.ok for v in itl_values(r))
    return 1000.0 * itl[min(len(itl) - 1, int(q * len(itl)))] if itl else None


def _policy(url: str) -> dict:
    import httpx

    r = httpx.get(url + "/specopd/policy", timeout=60)
    r.raise_for_status()
    return r.json()


def measure_arm(url: str, prompts: Sequence[Any], batch_sizes: Sequence[int], waves: int, max_new: int,
                speculative: bool) -> Dict[str, Dict[str, Optional[float]]]:
    """{str(b): {"itl_median_ms", and for the speculative arms "server_step_ms", "server_target_forward_ms",
    "plain_steps", "steps"}} for each batch size."""
    from sglang_specopd.app.bench.client import RequestParams, run_level

    params = RequestParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
    out = {}
    for b in batch_sizes:
        run_level(url, list(prompts[:b]), b, params)  # warm-up wave
        before = _policy(url) if speculative else None
        run = run_level(url, [prompts[i % len(prompts)] for i in range(b * waves)], b, params)
        row: Dict[str, Optional[float]] = {"itl_median_ms": _itl_ms(run.records, 0.5),
                                           "itl_p10_ms": _itl_ms(run.records, 0.1)}
        if speculative:
            after = _policy(url)
            steps = after["steps"] - before["steps"]
            for part in ("step", "target_forward"):
                total = (after["breakdown"][part] * after["steps"]
                         - (before["breakdown"][part] or 0.0) * before["steps"])
                row[f"server_{part}_ms"] = total / steps if steps else None
            row["plain_steps"] = after.get("plain_steps", 0) - before.get("plain_steps", 0)
            row["steps"] = steps
        out[str(b)] = row
    return out


def _start_arm(arm: str, cfg, drafter: Optional[str]):
    """(LaunchSpec, SGLangServer) of one arm: plain (no drafter) or SPECOPD with the goodput policy."""
    from sglang_specopd.app.launch.process import SGLangServer, free_port
    from sglang_specopd.app.serve.spec import launch_spec

    plain = arm == "plain"
    arm_cfg = cfg.model_copy(update={"drafter": None, "speculative_algorithm": None} if plain
                             else {"speculative_policy": "goodput"})
    spec = launch_spec(arm_cfg, port=free_port(), drafter=None if plain else drafter,
                       admin_api_key=None if plain else ADMIN_KEY)
    return spec, SGLangServer(spec)


def k0_step_ratios(config: str, drafter: Optional[str], *, batch_sizes: Sequence[int] = BATCH_SIZES,
                   waves: int = 3, max_new: int = 48, rounds: int = 4, arms: Sequence[str] = ARMS,
                   say=print) -> Dict[str, Any]:
    """``rounds`` rounds of every arm (one server up at a time, a fresh server process per arm and round, the arm
    order reversed every other round) and the ratios; see the module docstring."""
    import httpx
    from transformers import AutoTokenizer

    from sglang_specopd.app.bench.runner import load_prompts
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.serve.spec import config_path

    if "plain" not in arms:
        raise ValueError("the arms must include plain (the baseline)")
    cfg = ServeConfig.load(config_path(config))
    runs: Dict[str, List[Dict[str, Any]]] = {a: [] for a in arms}
    load = {"before": os.getloadavg()}
    for r in range(rounds):
        for arm in (arms if r % 2 == 0 else tuple(reversed(arms))):
            spec, srv = _start_arm(arm, cfg, drafter)
            with srv.start(timeout=900):
                say(f"round {r + 1}/{rounds}: {arm} server healthy after {srv.time_to_healthy_s:.0f} s")
                prompts, _ = load_prompts(AutoTokenizer.from_pretrained(spec.model_path), ["dialogue"],
                                          max(batch_sizes))
                if arm != "plain":
                    gamma = _policy(srv.url)["gamma"]
                    resp = httpx.post(srv.url + "/specopd/policy", json=forced_k0(gamma, arm == "k0_plain"),
                                      headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
                    resp.raise_for_status()
                runs[arm].append(measure_arm(srv.url, prompts, batch_sizes, waves, max_new,
                                             speculative=arm != "plain"))
                say(f"round {r + 1}/{rounds}: {arm}: {json.dumps(runs[arm][-1])}")
    load["after"] = os.getloadavg()
    out: Dict[str, Any] = {}
    for arm in arms:
        if arm == "plain":
            continue
        name = "k0_step" if arm == "k0_plain" else "k0_verify_step"
        for key, suffix in (("itl_median_ms", ""), ("itl_p10_ms", "_p10")):
            out[f"{name}_over_plain_step{suffix}"] = ratio_of_means(runs[arm], runs["plain"], batch_sizes, key)
        out[f"{name}_over_plain_step_ci95"] = paired_round_ci(runs[arm], runs["plain"], batch_sizes, "itl_median_ms")
    out.update({"k0_step_arms": runs, "k0_step_load_average": load,
                "k0_step_plain_spread": {str(b): spread([x[str(b)]["itl_median_ms"] for x in runs["plain"]])
                                         for b in batch_sizes},
                "k0_step_source": "client inter-token latency: median (_p10: 10th percentile); the ratio of the "
                                  "means over rounds, each round a fresh server process per arm; ci95: bootstrap "
                                  "over rounds of the round's ratio",
                "k0_step_config": {"batch_sizes": list(batch_sizes), "waves": waves, "max_new_tokens": max_new,
                                   "rounds": rounds, "arms": list(arms)}})
    return out


def ratio_of_means(arm: Sequence[Mapping[str, Any]], plain: Sequence[Mapping[str, Any]], batch_sizes: Sequence[int],
                   key: str) -> Dict[str, Optional[float]]:
    """Per batch size: mean of the arm's ``key`` over rounds / mean of plain's (None when a value is missing)."""
    out: Dict[str, Optional[float]] = {}
    for b in map(str, batch_sizes):
        xs, ys = [r[b][key] for r in arm], [r[b][key] for r in plain]
        out[b] = statistics.mean(xs) / statistics.mean(ys) if xs and ys and all(xs) and all(ys) else None
    return out


def paired_round_ci(arm: Sequence[Mapping[str, Any]], plain: Sequence[Mapping[str, Any]], batch_sizes: Sequence[int],
                    key: str, n_boot: int = 2000, seed: int = 0) -> Dict[str, Optional[List[float]]]:
    """Per batch size: the 95% bootstrap interval (resampling rounds) of the ratio of means, the arm's and plain's
    value of one round kept together (the rounds share the machine's state); None with fewer than 2 rounds."""
    import random

    rng = random.Random(seed)
    out: Dict[str, Optional[List[float]]] = {}
    for b in map(str, batch_sizes):
        pairs = [(a[b][key], p[b][key]) for a, p in zip(arm, plain) if a[b][key] and p[b][key]]
        if len(pairs) < 2:
            out[b] = None
            continue
        boots = sorted(sum(x for x, _ in draw) / sum(y for _, y in draw)
                       for draw in ([rng.choice(pairs) for _ in pairs] for _ in range(n_boot)))
        out[b] = [boots[int(0.025 * n_boot)], boots[int(0.975 * n_boot) - 1]]
    return out


def spread(values: Sequence[Optional[float]]) -> Optional[float]:
    """max / min of the values (how much one server process differs from another), None when any is missing."""
    vals = [v for v in values if v]
    return max(vals) / min(vals) if vals and len(vals) == len(values) else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-smollm2")
    ap.add_argument("--drafter", default=None, help="drafter dir (default: the config's shipped reference drafter)")
    ap.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4, help="fresh server processes per arm (the arms alternate)")
    ap.add_argument("--arms", default=",".join(ARMS), help="plain plus any of k0_plain, k0_verify")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default=RESULT, help="result file; {kind} is replaced by the machine kind (one file "
                                                   "per kind; an earlier one moves to history/)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from concurrency_reference.run import shipped_reference

    drafter = args.drafter or shipped_reference(args.config)
    res = k0_step_ratios(args.config, drafter, batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
                         waves=args.waves, max_new=args.max_new_tokens, rounds=args.rounds,
                         arms=tuple(a.strip() for a in args.arms.split(",") if a.strip()), say=lambda m: print(m, file=sys.stderr))
    from sglang_specopd.app.results import machine_kind, write_result

    path = write_result(Path(args.out.replace("{kind}", machine_kind())), res,
                        command="python benchmarks/goodput/k0_step.py " + " ".join(argv if argv is not None
                                                                                  else sys.argv[1:]))
    print(json.dumps({k: v for k, v in res.items() if k != "k0_step_arms"}))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
