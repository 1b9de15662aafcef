"""The server side of one regime: a SPECOPD server of the regime's drafter architecture with the traffic spool and
features on (``--config``, default ``cpu-smollm2-adapt``), its traffic (train-split prompts of the regime's domains
through the OpenAI chat API at the regime's temperature) and served tau on the held-out prompts (never spooled)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

ADMIN_KEY = "opd-regimes"


def start_drafter(arch: str, target: Path, shipped: Path, given: Optional[str], run_dir: Path) -> Path:
    """The regime's start drafter: the shipped one for DFlash, ``given`` (``--drafter-<arch>``) or a fresh
    drafter of ``arch`` with the shipped one's block size and context layers (its SFT phase then trains it)."""
    import json

    if given:
        return Path(given)
    if arch == "dflash":
        return shipped
    from sglang_specopd.wire.drafters.init import init_drafter

    out = run_dir / f"init-{arch}"
    if not (out / "config.json").is_file():
        cfg = json.loads((shipped / "config.json").read_text())
        init_drafter(target, out, block_size=int(cfg["block_size"]), num_layers=int(cfg["num_hidden_layers"]),
                     target_layer_ids=cfg["dflash_config"]["target_layer_ids"], arch=arch, overwrite=True)
    return out


@dataclass
class Env:
    url: str
    client: Any
    tok: Any
    target: Path
    drafter_dir: Path
    s: Dict[str, Any]

    def load_drafter(self):
        from specopd_trainer.drafters.registry import drafter_class_for_checkpoint

        return drafter_class_for_checkpoint(self.drafter_dir).from_pretrained(self.drafter_dir, self.target)

    def load_snapshot_drafter(self, snap: Path):
        from specopd_trainer.checkpoint import latest_checkpoint, load_checkpoint

        d = self.load_drafter()
        d.load_state_dict(load_checkpoint(latest_checkpoint(snap))["deployed"])
        return d

    def push(self, drafter, version: str) -> None:
        from specopd_trainer.pipeline import push_drafter

        push_drafter(self.url, drafter, version, ADMIN_KEY)

    def serving_version(self) -> Optional[str]:
        try:
            return self.client.drafter_info().get("version")
        except Exception:  # noqa: BLE001  (a version we cannot read: the adapter pushes its own again)
            return None

    @contextlib.contextmanager
    def load(self, regime, offset: int, requests: Optional[int] = None):
        """Traffic of ``regime`` while the block runs (``requests``: also wait for that many to finish). ``offset``
        rotates the train-split prompts so the snapshot's record traffic differs from the SFT phase's."""
        from sglang_specopd.app.traffic_load import ChatLoad, mixed
        from specopd_trainer.data import domain_split

        recs = mixed([r for d in regime.domains for r in domain_split(d)[0]], seed=offset)
        with ChatLoad(self.url, recs, streams=self.s["streams"], max_tokens=self.s["max_tokens"],
                      temperature=regime.temperature) as load:
            yield load
            while requests and len(load.snapshot()) < requests:
                time.sleep(1.0)

    def measure(self, regime, tag: str) -> List[dict]:
        """Served tau rows (``id`` prefixed by ``tag``, the seed) on the first ``eval_prompts`` held-out prompts
        per domain, at the regime's temperature, with whatever the server serves now."""
        from shift.measure import held_out
        from specopd_trainer.evaluate import evaluate_acceptance

        recs = held_out(regime.domains, self.s["eval_prompts"])
        res = evaluate_acceptance(self.url, self.tok, list(recs), temperature=regime.temperature, records=recs,
                                  max_new_tokens=self.s["eval_max_new_tokens"], progress=False)
        keep = ("domain", "completion_tokens", "verify_steps")
        return [{"id": f"{tag}{r['id']}", **{k: r[k] for k in keep}} for r in res["per_request"]]


@contextlib.contextmanager
def regime_server(regime, serve_cfg, target: Path, drafter_dir: Path, s: Dict[str, Any]):
    """Start the regime's server (its drafter); yields the :class:`Env`."""
    from transformers import AutoTokenizer

    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer, free_port
    from sglang_specopd.app.serve.spec import launch_spec
    from specopd_trainer.client.http import SpecOPDClient

    cfg = ServeConfig.model_validate({**serve_cfg.model_dump(), "drafter": str(drafter_dir)})
    spec = launch_spec(cfg, port=free_port(), admin_api_key=ADMIN_KEY)
    with SGLangServer(spec) as server, SpecOPDClient(server.url, admin_api_key=ADMIN_KEY) as client:
        yield Env(server.url, client, AutoTokenizer.from_pretrained(str(target)), target, drafter_dir, s)
