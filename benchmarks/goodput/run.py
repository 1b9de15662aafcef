"""The goodput policy vs the fixed block vs plain serving (issue 42, part 4): SmolLM2 + the shipped drafter on CPU.

Starts three servers from ``--config`` (all up at once; idle CPU servers sleep): plain (no drafter), SPECOPD with
``speculative_policy: fixed`` and SPECOPD with ``goodput``. For each temperature and concurrency level, each server
(in an order that rotates between levels) gets an unmeasured warm-up pass over ``--warmup`` prompts at that level
(the goodput policy calibrates its cost curve there: the steady state is measured, not the first minute), a
``/flush_cache``, then every held-out prompt once (``--limit`` per domain, ``--max-new-tokens`` each, ignore_eos)
with ``concurrency`` requests in flight (``specopd bench serve``'s client). The speculative servers' policy
statistics (``GET /specopd/policy``) are read before and after, so each level has its own chosen-k histogram and
step-time breakdown, and ``k0_step_over_plain_step`` (``k0_step.py``: a k = 0 step against a plain decode step at
batch 1, 2, 4, 8, one server at a time). Writes ``benchmarks/results/goodput_smollm2_<machine kind>.json``
(e.g. ``goodput_smollm2_epyc-avx2-fp32.json``; keys in shared notes ``results.md``):
throughput per arm, the ratios to plain with paired bootstrap 95% intervals over prompts, tau, k histograms, the
measured cost curve and the step breakdown. Run it on a quiet machine (about an hour at the defaults)::

    python benchmarks/goodput/run.py
    python benchmarks/goodput/run.py --limit 2 --concurrency 1,2 --max-new-tokens 16 --out /tmp/goodput_smoke.json

Part 3 (the shipped block-8 drafter truncated to k, which is what the goodput arm serves, vs short-block drafters
trained the same way): ``python benchmarks/reference_drafter/run.py sft --block-size 4 --run-dir RUN4`` (RUN4/data a link
to the reference run's data/), then ``--drafter RUN4/drafter-sft --block-size 4 --out ..._b4_...json`` here.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from sglang_specopd.app.bench.metrics import ratio_ci

DOMAINS = ["dialogue", "coding", "math", "agentic"]
RESULT = "benchmarks/results/goodput_smollm2_{kind}.json"  # {kind}: the machine kind (app.results.machine_kind)
ARMS = ("plain", "fixed", "goodput")
MIN_PROMPTS = 24


def stats_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> Dict[str, Any]:
    """What a speculative server's policy did between two ``GET /specopd/policy`` replies: steps, k histogram,
    reasons and the mean ms of each part of a step."""
    steps = after["steps"] - before["steps"]
    hist = {int(k): after["k_histogram"][k] - before["k_histogram"].get(k, 0) for k in after["k_histogram"]}
    reasons = {k: v - before["reasons"].get(k, 0) for k, v in after["reasons"].items()
               if v - before["reasons"].get(k, 0)}
    breakdown = {}
    for part in ("step", "target_forward", "drafter_forward", "other", "verify_rows"):
        x, y = before["breakdown"].get(part), after["breakdown"].get(part)
        total = (y or 0.0) * after["steps"] - (x or 0.0) * before["steps"]
        breakdown[part] = total / steps if steps and y is not None else None
    return {"steps": steps, "k_histogram": hist, "reasons": reasons, "breakdown_ms": breakdown}


def level_summary(runs: Mapping[str, Mapping[str, Any]], concurrency: int, temperature: float) -> Dict[str, Any]:
    """One level's entry (results.md's ``levels`` item) from ``runs[arm]`` = {``records``, ``tokens_per_s``,
    ``tau``, ``policy`` (the speculative arms' :func:`stats_delta`), ``itl_mean_s``}; the arms run (``plain`` and
    ``goodput`` always, ``fixed`` where ``--arms`` kept it)."""
    out: Dict[str, Any] = {"concurrency": concurrency, "temperature": temperature}
    for arm in ARMS:
        if arm in runs:
            out[f"{arm}_tokens_per_s"] = runs[arm]["tokens_per_s"]
    for arm in [a for a in ("fixed", "goodput") if a in runs]:
        r = ratio_ci(runs[arm]["records"], runs["plain"]["records"])
        out[f"{arm}_over_plain"], out[f"{arm}_over_plain_ci95"] = r["mean"], r["ci95"]
        out[f"{arm}_tau"] = runs[arm]["tau"]
        out[f"{arm}_policy"] = runs[arm]["policy"]
    out["k_histogram"] = runs["goodput"]["policy"]["k_histogram"]
    out["plain_step_ms"] = 1000.0 * runs["plain"]["itl_mean_s"] if runs["plain"]["itl_mean_s"] else None
    return out


def breakdown(levels: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """``step_breakdown_ms`` at the lowest concurrency measured (T0 first): the speculative arms' server-side parts;
    plain's step is the client's mean inter-token latency (the plain worker is not instrumented)."""
    lv = min(levels, key=lambda x: (x["concurrency"], x["temperature"]))
    plain = {"step": lv["plain_step_ms"], "target_forward": None, "drafter_forward": 0.0, "other": None,
             "source": "client inter-token latency"}
    return {"concurrency": lv["concurrency"], "temperature": lv["temperature"], "plain": plain,
            **{arm: {k: v for k, v in lv[f"{arm}_policy"]["breakdown_ms"].items()} for arm in ("fixed", "goodput")
               if lv.get(f"{arm}_policy")}}


def _policy(url: str) -> Optional[dict]:
    import httpx

    r = httpx.get(url + "/specopd/policy", timeout=60)
    return r.json() if r.status_code == 200 else None


def run_arm(server, prompts, warm, conc: int, temperature: float, max_new: int) -> Dict[str, Any]:
    """Warm-up pass, cache flush, the measured pass; the arm's level numbers."""
    from sglang_specopd.app.bench.client import RequestParams, run_level
    from sglang_specopd.app.bench.metrics import acceptance, itl_values
    from sglang_specopd.app.bench.runner import flush_cache

    params = RequestParams(max_new_tokens=max_new, temperature=temperature, ignore_eos=True)
    if warm:
        run_level(server.url, warm, conc, params)
    flush_cache(server)
    before = _policy(server.url) if server.role != "plain" else None
    run = run_level(server.url, prompts, conc, params)
    after = _policy(server.url) if server.role != "plain" else None
    ok = [r for r in run.records if r.ok]
    itl = [v for r in ok for v in itl_values(r)]
    return {"records": [asdict(r) for r in run.records],
            "tokens_per_s": sum(r.completion_tokens for r in ok) / run.duration_s,
            "errors": len(run.records) - len(ok),
            "tau": acceptance(run.records).get("mean_acceptance_length") if server.role != "plain" else None,
            "policy": stats_delta(before, after) if before and after else None,
            "itl_mean_s": float(np.mean(itl)) if itl else None}


@contextlib.contextmanager
def three_servers(config: str, drafter: Optional[str], arms: Sequence[str] = ARMS, say=print,
                  block_size: Optional[int] = None):
    """The plain, fixed-policy and goodput-policy servers of ``config`` (those in ``arms``), all up:
    ({arm: BenchServer with role = arm}, the target's directory)."""
    from sglang_specopd.app.bench.runner import BenchServer
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer, free_port
    from sglang_specopd.app.serve.spec import config_path, launch_spec

    cfg = ServeConfig.load(config_path(config))
    if block_size is not None:  # a short-block drafter (issue 42, part 3)
        cfg = cfg.model_copy(update={"block_size": block_size})
    updates = {"plain": {"drafter": None, "speculative_algorithm": None},
               "fixed": {"speculative_policy": "fixed"}, "goodput": {"speculative_policy": "goodput"}}
    with contextlib.ExitStack() as stack:
        out, model_path = {}, None
        for arm in arms:
            spec = launch_spec(cfg.model_copy(update=updates[arm]), port=free_port(),
                               drafter=None if arm == "plain" else drafter)
            srv = SGLangServer(spec)
            stack.enter_context(srv.start(timeout=900))
            say(f"{arm} server healthy after {srv.time_to_healthy_s:.0f} s at {srv.url}")
            out[arm], model_path = BenchServer(role=arm, url=srv.url, launched=True, config=config,
                                               drafter=spec.drafter_path), spec.model_path
        yield out, model_path


def measure(args, drafter: Optional[str], say=print):
    """Every (temperature, concurrency, arm) run: ({(t, c): {arm: run_arm(...)}}, per-level arm order,
    goodput's last policy reply, prompts skipped). With ``--one-server-at-a-time`` the arms run one after another
    (one server up at a time: the order cannot rotate); otherwise all three servers are up and the arms' order
    rotates between levels."""
    from transformers import AutoTokenizer

    from sglang_specopd.app.bench.runner import load_prompts

    keys = [(float(t), int(c)) for t in args.temperatures.split(",") for c in args.concurrency.split(",")]
    chosen = arms_of(args.arms)
    groups = [[arm] for arm in chosen] if args.one_server_at_a_time else [list(chosen)]
    runs: Dict[Any, Dict[str, Any]] = {k: {} for k in keys}
    orders = {}
    last, skipped = None, {}
    for arms in groups:
        with three_servers(args.config, drafter, arms, say=say,
                           block_size=args.block_size) as (servers, model_path):
            tok = AutoTokenizer.from_pretrained(model_path)
            prompts, skipped = load_prompts(tok, DOMAINS, args.limit)
            extra = [p for d in DOMAINS for p in load_prompts(tok, [d], args.limit + 2)[0][args.limit:]]
            warm = extra[: args.warmup]
            for i, key in enumerate(keys):
                order = arms[i % len(arms):] + arms[: i % len(arms)]
                orders.setdefault(key, []).extend(order)
                for arm in order:
                    runs[key][arm] = run_arm(servers[arm], prompts, warm, key[1], key[0], args.max_new_tokens)
            if "goodput" in servers:
                last = _policy(servers["goodput"].url)
    return runs, orders, last, skipped


def arms_of(text: str) -> List[str]:
    """``--arms``: plain and goodput always run (every ratio is over plain; goodput is the default policy); fixed
    is optional (it costs a third of the run). Raises ValueError on an unknown arm or a missing plain / goodput."""
    arms = [a.strip() for a in text.split(",") if a.strip()]
    if set(arms) - set(ARMS) or not {"plain", "goodput"} <= set(arms):
        raise ValueError(f"--arms {text!r}: plain and goodput, optionally fixed (of {', '.join(ARMS)})")
    return [a for a in ARMS if a in arms]


def k0_step(config: str, drafter: Optional[str], waves: int, say=print) -> Dict[str, Any]:
    """``k0_step_over_plain_step`` and its arms (benchmarks/goodput/k0_step.py, one server at a time)."""
    from goodput.k0_step import k0_step_ratios

    return k0_step_ratios(config, drafter, waves=waves, say=say)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-smollm2")
    ap.add_argument("--drafter", default=None, help="drafter dir (default: the reference drafter shipped for the "
                                                    "config's target)")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--limit", type=int, default=MIN_PROMPTS, help="held-out prompts per domain")
    ap.add_argument("--warmup", type=int, default=8, help="unmeasured prompts per arm before each level")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=None,
                    help="serve at this block size (a block-4 / block-2 drafter; default: the config's)")
    ap.add_argument("--out", default=RESULT, help="result file; {kind} is replaced by the machine kind, e.g. "
                    "epyc-avx2-fp32 (one file per kind)")
    ap.add_argument("--k0-waves", type=int, default=3, help="waves per batch size of the k = 0 step vs plain step "
                                                            "measurement (k0_step.py; 0: skip it)")
    ap.add_argument("--arms", default=",".join(ARMS), help="the arms run: plain and goodput, optionally fixed "
                                                          "(leaving it out saves a third of the time)")
    ap.add_argument("--one-server-at-a-time", action="store_true",
                    help="run the arms one after another with one server up (a shared machine); default: all three "
                         "up, the arms' order rotating between levels")
    args = ap.parse_args(argv)
    try:
        arms_of(args.arms)
    except ValueError as exc:
        ap.error(str(exc))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from concurrency_reference.run import shipped_reference

    from sglang_specopd.app.results import machine_kind, write_result

    drafter = args.drafter or shipped_reference(args.config)
    runs, orders, last, skipped = measure(args, drafter, say=lambda m: print(m, file=sys.stderr))
    levels: List[Dict[str, Any]] = []
    for (t, conc), by_arm in runs.items():
        lv = level_summary(by_arm, conc, t)
        lv["order"] = orders[(t, conc)]
        lv["errors"] = {arm: by_arm[arm]["errors"] for arm in ARMS if arm in by_arm}
        levels.append(lv)
        fixed = f"fixed {lv['fixed_over_plain']:.2f}x, " if "fixed_over_plain" in lv else ""
        print(f"T{t:g} c={conc}: plain {lv['plain_tokens_per_s']:.2f} tok/s, {fixed}"
              f"goodput {lv['goodput_over_plain']:.2f}x [{lv['goodput_over_plain_ci95'][0]:.2f}, "
              f"{lv['goodput_over_plain_ci95'][1]:.2f}], k {lv['k_histogram']}", file=sys.stderr)
    curve = (last or {}).get("cost_curve_ms") or {}
    fit = (last or {}).get("cost_curve_fit_ms") or {}
    payload = {
        "server_config": args.config, "drafter": drafter, "block_size": args.block_size, "domains": DOMAINS,
        "limit_per_domain": args.limit, "arms": arms_of(args.arms),
        "skipped_prompts": skipped, "max_new_tokens": args.max_new_tokens, "warmup_prompts": args.warmup,
        "one_server_at_a_time": args.one_server_at_a_time, "counts_as_result": args.limit >= MIN_PROMPTS,
        "gamma": (last or {}).get("gamma"), "levels": levels,
        "breakdown_note": "ms per decode step; other = the step minus both forwards plus the scheduler time between "
                          "decode steps",
        "cost_curve_ms": {str(b): {str(k + 1): ms for k, ms in enumerate(v)} for b, v in curve.items()},
        "cost_curve_fit_ms": {str(b): v and {str(k + 1): ms for k, ms in enumerate(v)} for b, v in fit.items()},
        "cost_curve_note": "per batch-size bucket: ms of a served step by verify rows per request (k + 1); _fit: "
                           "the non-decreasing fit the policy used (goodput server, end of the run)",
        "step_breakdown_ms": breakdown(levels),
    }
    if args.k0_waves:  # k0_step_over_plain_step: a k = 0 step against a plain decode step at batch 1, 2, 4, 8
        payload.update(k0_step(args.config, drafter, args.k0_waves, say=lambda m: print(m, file=sys.stderr)))
    command = "python " + " ".join(["benchmarks/goodput/run.py", *(argv if argv is not None else sys.argv[1:])])
    write_result(Path(args.out.replace("{kind}", machine_kind())), payload, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
