"""A k = 0 step against a plain decode step at batch 1, 2, 4, 8 (issue 53): ``k0_step_over_plain_step``.

One server at a time from ``--config``: plain (no drafter), then SPECOPD with the goodput policy forced to k = 0 at
every step (a fixed cost curve, no exploration, set through ``POST /specopd/policy``), once with k = 0 as SGLang's
plain decode (``plain_k0``, the default) and once through the verify path (``plain_k0: false``, the behaviour before
issue 53), then plain again (A-B-C-A: the plain step is the mean of both plain runs, so a drifting machine load
biases no arm alone). For each batch size b, ``--waves`` waves of b requests (``--max-new-tokens`` each, ignore_eos, greedy) run
with b in flight after an unmeasured wave; a step's time is the median client inter-token latency (``_p10``: its
10th percentile, less sensitive to other work on a shared machine; the same
measurement for every arm: the plain worker is not instrumented), and the speculative servers' own mean step time
(``GET /specopd/policy``) is kept beside it. The machine's load average is recorded: on a busy machine the ratio is
not a result.

    python benchmarks/goodput/k0_step.py --out /tmp/k0_step.json
    python benchmarks/goodput/run.py ...   # also records k0_step_over_plain_step (its --k0-waves)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

BATCH_SIZES = (1, 2, 4, 8)
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


def k0_step_ratios(config: str, drafter: Optional[str], *, batch_sizes: Sequence[int] = BATCH_SIZES,
                   waves: int = 3, max_new: int = 48, say=print) -> Dict[str, Any]:
    """The three arms (one server up at a time) and the ratios; see the module docstring."""
    import httpx
    from transformers import AutoTokenizer

    from sglang_specopd.app.bench.runner import load_prompts
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer, free_port
    from sglang_specopd.app.serve.spec import config_path, launch_spec

    cfg = ServeConfig.load(config_path(config))
    arms: Dict[str, Any] = {}
    load = {"before": os.getloadavg()}
    for arm in ("plain", "k0_plain", "k0_verify", "plain_again"):
        plain = arm.startswith("plain")
        arm_cfg = cfg.model_copy(update={"drafter": None, "speculative_algorithm": None} if plain
                                 else {"speculative_policy": "goodput"})
        spec = launch_spec(arm_cfg, port=free_port(), drafter=None if plain else drafter,
                           admin_api_key=None if plain else ADMIN_KEY)
        srv = SGLangServer(spec)
        with srv.start(timeout=900):
            say(f"{arm} server healthy after {srv.time_to_healthy_s:.0f} s")
            prompts, _ = load_prompts(AutoTokenizer.from_pretrained(spec.model_path), ["dialogue"], max(batch_sizes))
            if not plain:
                gamma = _policy(srv.url)["gamma"]
                r = httpx.post(srv.url + "/specopd/policy", json=forced_k0(gamma, arm == "k0_plain"),
                               headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
                r.raise_for_status()
            arms[arm] = measure_arm(srv.url, prompts, batch_sizes, waves, max_new, speculative=not plain)
            say(f"{arm}: {json.dumps(arms[arm])}")
    load["after"] = os.getloadavg()

    def ratio(arm: str, key: str = "itl_median_ms") -> Dict[str, Optional[float]]:
        out = {}
        for b in map(str, batch_sizes):
            x, ys = arms[arm][b][key], [arms[p][b][key] for p in ("plain", "plain_again")]
            out[b] = x / statistics.mean(ys) if x and all(ys) else None
        return out

    return {"k0_step_over_plain_step": ratio("k0_plain"), "k0_verify_step_over_plain_step": ratio("k0_verify"),
            "k0_step_over_plain_step_p10": ratio("k0_plain", "itl_p10_ms"),
            "k0_verify_step_over_plain_step_p10": ratio("k0_verify", "itl_p10_ms"),
            "k0_step_arms": arms, "k0_step_load_average": load,
            "k0_step_source": "client inter-token latency: median (_p10: 10th percentile)",
            "k0_step_config": {"batch_sizes": list(batch_sizes), "waves": waves, "max_new_tokens": max_new}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="cpu-smollm2")
    ap.add_argument("--drafter", default=None, help="drafter dir (default: the config's shipped reference drafter)")
    ap.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", required=True, help="JSON file to write (a scratch file: see the module docstring)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from concurrency_reference.run import shipped_reference

    drafter = args.drafter or shipped_reference(args.config)
    res = k0_step_ratios(args.config, drafter, batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
                         waves=args.waves, max_new=args.max_new_tokens, say=lambda m: print(m, file=sys.stderr))
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(json.dumps({k: v for k, v in res.items() if k != "k0_step_arms"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
