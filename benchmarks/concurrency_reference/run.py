"""Serving with the reference drafter vs plain serving at concurrency 1, 2, 4, 8, at T=0 and T=1 (issue 19, part 4).

For each temperature, ``specopd bench serve --launch CONFIG --launch-baseline`` starts the SPECOPD server with the
drafter and the same config without it, sends the same held-out prompts of the four domains (``--limit`` per
domain, at least 24 for the result to count) at each concurrency level, and records throughput, latency and
SGLang's per-request acceptance. This script runs it once per temperature (each run's raw payload is kept in
``--run-dir``; a re-run reuses finished ones) and writes ``benchmarks/results/concurrency_reference_smollm2_cpu.json``:
per temperature and level, output tokens/s of both servers and the speedup, and tau per domain and overall with
95% bootstrap intervals over prompts (:func:`specopd_trainer.intervals.acceptance_intervals`), plus a PNG::

    python benchmarks/concurrency_reference/run.py            # the shipped reference drafter (explicitly), cpu-smollm2
    python benchmarks/concurrency_reference/run.py --drafter runs/reference_drafter/drafter-sft --limit 24
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

DOMAINS = ["dialogue", "coding", "math", "agentic"]
RESULT = Path("benchmarks/results/concurrency_reference_smollm2_cpu.json")
MIN_PROMPTS = 24  # the measurement rule: at least 24 held-out prompts per domain


def tau_rows(per_request: list) -> list:
    """``bench serve``'s per-request records -> the rows :func:`acceptance_intervals` takes (ok requests only)."""
    return [{"id": r["id"], "domain": r["domain"], "completion_tokens": r["completion_tokens"],
             "verify_steps": r["verify_ct"] or 0} for r in per_request if r.get("ok")]


def summarize(payloads: dict, domains: list) -> dict:
    """``{temperature key: bench payload}`` -> the result's ``temperatures`` block.

    Per key (``"T0"``, ``"T1"``) and level: ``concurrency``, ``specopd_tokens_per_s``, ``plain_tokens_per_s``,
    ``speedup`` (their ratio), ``errors`` (both servers), ``acceptance`` (tau per domain, mean, ci95 and ci95 by
    domain over this level's requests). Raises ValueError if a level of the speculative server has no request with
    verify steps in some domain (nothing to measure).
    """
    from specopd_trainer.intervals import acceptance_intervals

    out = {}
    for key, payload in payloads.items():
        levels = []
        for lv in payload["levels"]:
            spec, base = lv["specopd"], lv.get("baseline") or {}
            s_tps, b_tps = spec.get("output_tokens_per_s"), base.get("output_tokens_per_s")
            acc = acceptance_intervals(tau_rows(spec["per_request"]), domains)
            levels.append({"concurrency": lv["concurrency"], "specopd_tokens_per_s": s_tps,
                           "plain_tokens_per_s": b_tps, "speedup": (s_tps / b_tps) if s_tps and b_tps else None,
                           "errors": {"specopd": spec.get("errors"), "plain": base.get("errors")},
                           "acceptance": acc})
        out[key] = levels
    return out


def shipped_reference(config: str):
    """The reference drafter shipped for ``config``'s target and block size (a directory as str), or None."""
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.models import resolve_target
    from sglang_specopd.app.drafters.reference import reference_drafter
    from sglang_specopd.app.serve.spec import config_path

    cfg = ServeConfig.load(config_path(config))
    found = reference_drafter(resolve_target(cfg.target), cfg.block_size or 8)
    if found is None:
        return None
    try:  # repo-relative in the result file when it lies under the working directory
        return str(found.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(found)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-smollm2")
    ap.add_argument("--drafter", default=None, help="drafter dir (default: the reference drafter shipped for the "
                                                    "config's target; `bench serve` alone would prefer the SFT "
                                                    "drafter `specopd main` trained)")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--limit", type=int, default=MIN_PROMPTS, help="held-out prompts per domain")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--run-dir", default="runs/concurrency_reference")
    ap.add_argument("--out", default=str(RESULT))
    ap.add_argument("--keep-from", default=None,
                    help="an earlier result file whose temperatures this run does not measure are carried over "
                         "(same config, drafter, limit and max-new-tokens required), e.g. T=0 when adding T=1")
    args = ap.parse_args(argv)
    if args.drafter is None:
        args.drafter = shipped_reference(args.config)
        if args.drafter is None:
            print(f"error: no reference drafter ships for {args.config}'s target; pass --drafter", file=sys.stderr)
            return 2
    run = Path(args.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    payloads = {}
    for t in [float(x) for x in args.temperatures.split(",")]:
        key = f"T{t:g}"
        raw = run / f"{key}.json"
        if not raw.is_file():
            cmd = [sys.executable, "-m", "sglang_specopd.app.cli", "bench", "serve", "--launch", args.config,
                   "--launch-baseline", "--concurrency", args.concurrency, "--limit", str(args.limit),
                   "--max-new-tokens", str(args.max_new_tokens), "--temperature", f"{t:g}", "--out", str(raw)]
            if args.drafter:
                cmd += ["--drafter", args.drafter]
            print("+ " + " ".join(cmd), file=sys.stderr)
            if subprocess.run(cmd).returncode != 0 or not raw.is_file():
                print(f"error: bench serve at T={t:g} failed", file=sys.stderr)
                return 1
        payloads[key] = json.loads(raw.read_text())
    first = next(iter(payloads.values()))
    from sglang_specopd.app.results import write_result

    payload = {
        "server_config": args.config, "drafter": args.drafter,
        "domains": DOMAINS, "limit_per_domain": args.limit, "max_new_tokens": args.max_new_tokens,
        "counts_as_result": args.limit >= MIN_PROMPTS, "target": first.get("target"),
        "temperatures": summarize(payloads, DOMAINS),
        "raw_payloads": {k: str(run / f"{k}.json") for k in payloads},
        "load_average_1m": {k: p.get("load_average_1m") for k, p in payloads.items()},
    }
    if args.keep_from:
        try:
            payload = carry_over(json.loads(Path(args.keep_from).read_text()), payload)
        except ValueError as e:
            print(f"error: --keep-from {args.keep_from}: {e}", file=sys.stderr)
            return 2
    out = write_result(Path(args.out), payload, command="python " + " ".join(sys.argv))
    plot(payload["temperatures"], out.with_suffix(".png"))
    for key, levels in payload["temperatures"].items():
        for lv in levels:
            a = lv["acceptance"]
            print(f"{key} c={lv['concurrency']}: speedup {lv['speedup']:.2f}x, tau {a['mean']:.3f} "
                  f"[{a['ci95'][0]:.3f}, {a['ci95'][1]:.3f}]", file=sys.stderr)
    return 0


def carry_over(earlier: dict, payload: dict) -> dict:
    """Copy into ``payload`` the temperatures of ``earlier`` (a result of this script) it did not measure.

    Each carried temperature keeps its own raw payload path, load average and the command that measured it
    (``carried_from``). Raises ValueError when the two runs differ in config, drafter, prompts or lengths, as
    their speedups would not be comparable.
    """
    from sglang_specopd.app.results import portable

    for key in ("server_config", "drafter", "limit_per_domain", "max_new_tokens"):
        # result files record paths portably (write_result): compare this run's values as they would be written
        if portable(earlier.get(key)) != portable(payload.get(key)):
            raise ValueError(f"{key} differs: {earlier.get(key)!r} there, {payload.get(key)!r} here")
    merged = dict(payload)
    merged["temperatures"] = dict(payload["temperatures"])
    merged["raw_payloads"] = dict(payload["raw_payloads"])
    merged["load_average_1m"] = dict(payload["load_average_1m"])
    carried = {}
    for key, levels in earlier.get("temperatures", {}).items():
        if key in merged["temperatures"]:
            continue
        merged["temperatures"][key] = levels
        merged["raw_payloads"][key] = earlier.get("raw_payloads", {}).get(key)
        merged["load_average_1m"][key] = earlier.get("load_average_1m", {}).get(key)
        carried[key] = {"command": earlier.get("command"), "git_commit": earlier.get("git_commit"),
                        "created": earlier.get("created")}
    if carried:
        merged["carried_from"] = {**earlier.get("carried_from", {}), **carried}
    return merged


def plot(temperatures: dict, path: Path) -> None:
    """Speedup vs concurrency, one line per temperature (a dashed line at 1.0 = plain serving)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sglang_specopd.app.results import save_figure

    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    for key, levels in temperatures.items():
        xs = [lv["concurrency"] for lv in levels if lv["speedup"] is not None]
        ax.plot(xs, [lv["speedup"] for lv in levels if lv["speedup"] is not None], marker="o",
                label=f"{key} (tau {levels[0]['acceptance']['mean']:.2f} at c={levels[0]['concurrency']})")
    ax.axhline(1.0, ls="--", color="grey", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s, speculative / plain")
    ax.set_title("SmolLM2-135M + reference drafter vs plain serving (CPU)")
    ax.legend()
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
