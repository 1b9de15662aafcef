"""What capturing the target's context features while serving costs, and what it saves the trainer.

Serving: the same server config twice (spool on; features captured, then not), the same new-domain traffic
(``streams`` users, streamed) for ``minutes`` each, after ``warmup_s``: output tokens/s and ITL percentiles;
``serving_overhead_fraction`` = 1 - tokens/s with capture / tokens/s without. Training: the items the capturing
server spooled, given their features twice by :class:`specopd_trainer.adapt.features.FeatureSource`: from the rows
captured while serving (``served``) and by the features-only ``score_trees`` second pass (``score``), no traffic
meanwhile; tokens made trainable per second of the trainer's wall time, each.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict

from .arm import ADMIN_KEY, say
from .measure import itl_percentiles, load_stats


def _serve(serve_cfg, target: Path, prompts, settings, capture: bool, layer_ids) -> Dict[str, Any]:
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer, free_port
    from sglang_specopd.app.serve.spec import launch_spec
    from sglang_specopd.app.traffic_load import ChatLoad, mixed
    from specopd_trainer.adapt.features import FeatureSource
    from specopd_trainer.adapt.reader import Cursor, ReaderCounts, TrafficReader
    from specopd_trainer.client.http import SpecOPDClient

    cfg = ServeConfig.model_validate({**serve_cfg.model_dump(),
                                      "traffic_features_mb": serve_cfg.traffic_features_mb if capture else 0})
    spec = launch_spec(cfg, port=free_port(), admin_api_key=ADMIN_KEY)
    say(f"feature cost: serving with capture {'on' if capture else 'off'} for {settings['feature_minutes']:g} min")
    with SGLangServer(spec) as server:
        clock0 = time.monotonic()
        clock = lambda: time.monotonic() - clock0  # noqa: E731
        records = mixed([r for d in prompts["new_domains"] for r in prompts["train"][d]], seed=1)
        with ChatLoad(server.url, records, streams=settings["streams"], max_tokens=settings["max_tokens"],
                      stream=True, clock=clock) as load:
            time.sleep(settings["warmup_s"] + settings["feature_minutes"] * 60)
            t_end = clock()
        rows = load.snapshot()
        out = {"load": load_stats(rows, settings["warmup_s"], t_end),
               "itl": itl_percentiles(rows, settings["warmup_s"], t_end)}
        if capture:  # the trainer's side, on the same spooled items, with no traffic
            with SpecOPDClient(server.url, admin_api_key=ADMIN_KEY) as client:
                items = TrafficReader(client, Cursor(), ReaderCounts(), holdout_every=10**9,
                                      vocab_size=10**9, max_items=settings["feature_items"]).read()
                for mode in ("served", "score"):
                    src = FeatureSource(client, layer_ids, mode)
                    t0 = time.monotonic()
                    src.features(items)
                    dt = time.monotonic() - t0
                    tokens = sum(len(it.input_ids) for it in items)
                    out[f"train_tokens_per_s_{mode}"] = tokens / dt
                    out[f"counts_{mode}"] = dict(src.counts)
                out["feature_items"] = len(items)
    return out


def feature_cost(serve_cfg, target: Path, prompts, settings, layer_ids) -> Dict[str, Any]:
    """``{"serving_overhead_fraction", "train_tokens_per_s_with", "..._without", "with": {...}, "without": {...}}``."""
    on = _serve(serve_cfg, target, prompts, settings, True, layer_ids)
    off = _serve(serve_cfg, target, prompts, settings, False, layer_ids)
    tps_on, tps_off = on["load"]["output_tokens_per_s"], off["load"]["output_tokens_per_s"]
    return {"serving_overhead_fraction": 1 - tps_on / tps_off if tps_off else None,
            "train_tokens_per_s_with": on.get("train_tokens_per_s_served"),
            "train_tokens_per_s_without": on.get("train_tokens_per_s_score"),
            "itl_p99_s": {"with": on["itl"]["p99"], "without": off["itl"]["p99"]},
            "with": on, "without": off}
