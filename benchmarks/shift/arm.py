"""One arm of the traffic-shift benchmark: a fresh server with the shipped drafter, the old domains' traffic, then the
shift to the new domains while ``specopd adapt`` runs with the arm's algorithm (none for ``static``).

Timeline (seconds on the arm's clock, 0 = server healthy): old-domain traffic for ``old_minutes`` (the adapter, if
any, already reads it), then new-domain traffic for ``shift_minutes``; at each of ``curve_minutes`` after the shift
the new domains' curve prompts are measured (served tau, T=0, never spooled); at the end the adapter is stopped (one
last judgement of its candidate), the traffic stops, and the final held-out prompts of the new and the old domains
are measured with whatever is deployed. Traffic: ``streams`` users, OpenAI chat API, streamed (for the ITL).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from .measure import itl_percentiles, load_stats, served_tau

ADMIN_KEY = "traffic-shift"


def say(text: str) -> None:
    print(f"[traffic-shift {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run_arm(name: str, algorithm: Optional[str], serve_cfg, target: Path, settings: Dict[str, Any],
            prompts: Dict[str, Any], run_dir: Path) -> Dict[str, Any]:
    """Run arm ``name`` (``algorithm`` None: the static drafter); returns its part of the result."""
    from transformers import AutoTokenizer

    from sglang_specopd.app.launch.process import SGLangServer, free_port
    from sglang_specopd.app.serve.spec import launch_spec
    from sglang_specopd.app.traffic_load import ChatLoad, mixed

    tok = AutoTokenizer.from_pretrained(str(target))
    spec = launch_spec(serve_cfg, port=free_port(), admin_api_key=ADMIN_KEY)
    say(f"arm {name}: starting the server")
    with SGLangServer(spec) as server:
        clock0 = time.monotonic()
        clock = lambda: time.monotonic() - clock0  # noqa: E731
        adapter, thread, box = None, None, {}
        if algorithm is not None:
            adapter = _adapter(server.url, spec, target, algorithm, settings, run_dir / name)
            thread = threading.Thread(target=lambda: box.update(out=adapter.run()), name="adapter", daemon=True)
            thread.start()
        old = mixed([r for d in prompts["old_domains"] for r in prompts["train"][d]], seed=0)
        new = mixed([r for d in prompts["new_domains"] for r in prompts["train"][d]], seed=0)
        kw = dict(streams=settings["streams"], max_tokens=settings["max_tokens"], temperature=0.0, stream=True,
                  clock=clock)
        records: List[Any] = []
        say(f"arm {name}: old-domain traffic for {settings['old_minutes']:g} min")
        with ChatLoad(server.url, old, **kw) as load:
            _sleep_until(clock, settings["old_minutes"] * 60)
        records += load.snapshot()
        shift_t = clock()
        curve = []
        say(f"arm {name}: the traffic shifts to {', '.join(prompts['new_domains'])} for "
            f"{settings['shift_minutes']:g} min")
        with ChatLoad(server.url, new, **kw) as load:
            for m in settings["curve_minutes"]:
                _sleep_until(clock, shift_t + m * 60)
                t = clock() - shift_t
                res = served_tau(server.url, tok, prompts["curve"], settings["eval_max_new_tokens"])
                curve.append({"t_s": round(t, 1), "new_tau": res["T0"]["mean"], "new_ci95": res["T0"]["ci95"],
                              "deployed": _serving_version(server.url), "per_request": res["per_request"]})
                say(f"arm {name}: {t / 60:.1f} min after the shift, new-domain tau {res['T0']['mean']:.3f} "
                    f"[{res['T0']['ci95'][0]:.3f}, {res['T0']['ci95'][1]:.3f}]")
            _sleep_until(clock, shift_t + settings["shift_minutes"] * 60)
            end_t = clock()
            if adapter is not None:
                adapter.request_stop("benchmark end")
                thread.join(900)
        records += load.snapshot()
        final_new = served_tau(server.url, tok, prompts["final_new"], settings["eval_max_new_tokens"])
        final_old = served_tau(server.url, tok, prompts["final_old"], settings["eval_max_new_tokens"])
        deployed = _serving_version(server.url)
        if adapter is not None:
            adapter.deployed.save_pretrained(run_dir / name / "drafter-deployed", overwrite=True)
    out = box.get("out") or {}
    say(f"arm {name}: final new-domain tau {final_new['T0']['mean']:.3f}, old {final_old['T0']['mean']:.3f}, "
        f"deployed {deployed!r}")
    return {"algorithm": algorithm, "curve": curve, "final": {"new": final_new, "old": final_old},
            "deployed_version": deployed, "pushes": out.get("pushes", 0), "rollbacks": out.get("rollbacks", 0),
            "traffic_tokens_seen": out.get("traffic_tokens_seen", 0), "trained_tokens": out.get("trained_tokens", 0),
            "traffic_tokens_trained": out.get("traffic_tokens_trained", 0), "adapt": _adapt_summary(out),
            "shift_at_s": round(shift_t, 1), "end_s": round(end_t, 1),
            "itl_shift_s": itl_percentiles(records, shift_t, end_t), "load_shift": load_stats(records, shift_t, end_t),
            "load_all": load_stats(records, 0.0, end_t)}


def _adapter(url: str, spec, target: Path, algorithm: str, settings: Dict[str, Any], run_dir: Path):
    from specopd_trainer.adapt.config import AdaptConfig
    from specopd_trainer.adapt.loop import Adapter
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.registry import drafter_class_for_checkpoint
    from specopd_trainer.pipeline import push_drafter

    client = SpecOPDClient(url, admin_api_key=ADMIN_KEY)
    drafter = drafter_class_for_checkpoint(spec.drafter_path).from_pretrained(spec.drafter_path, target)
    options = settings["algorithm_options"]
    cfg = AdaptConfig(algorithm=algorithm, lr=settings["lr"], start_at="newest", log_every_s=60.0,
                      algorithm_options=options.get("sft" if algorithm == "auto" else algorithm, {}),
                      auto_options={k: v for k, v in options.items() if k != "sft"} if algorithm == "auto" else {})
    return Adapter(client, drafter, run_dir, cfg, push=lambda d, v: push_drafter(url, d, v, ADMIN_KEY),
                   serving_version=lambda: _serving_version(url), progress=True)


def _serving_version(url: str) -> Optional[str]:
    import httpx

    try:
        return httpx.get(url + "/specopd/drafter", timeout=30).json().get("version")
    except (httpx.HTTPError, ValueError):
        return None


def _sleep_until(clock: Callable[[], float], t: float) -> None:
    while clock() < t:
        time.sleep(min(1.0, t - clock()))


def _adapt_summary(out: Dict[str, Any]) -> Dict[str, Any]:
    keys = ("step", "stopped_by", "reader", "features", "deployed", "verdicts", "timings_s", "train_items",
            "holdout_items", "push_errors", "candidate_resets")
    return {k: out[k] for k in keys if k in out}
