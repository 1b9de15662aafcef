"""The ``specopd adapt`` loop: read served traffic, train a candidate, deploy it only when it measures better.

One iteration: read one spool page (:mod:`.reader`; again at once while a backlog is waiting), give the new items
their context features (:mod:`.features`), their slice (:mod:`.slices`), put them in the training or held-out buffer
(:mod:`.buffer`); once the training buffer holds ``min_train_tokens`` response tokens, one optimiser step of the
algorithm's adapt step (AdamW, linear warmup then constant LR, gradient clip); every ``eval_every`` steps
:func:`specopd_trainer.adapt.judge.judge` (every check reported; one that could not run blocks) pushes the candidate
or rolls back. A step whose loss is not finite restores the candidate to the deployed weights (``candidate_resets``).
Checkpoints: every ``ckpt_every`` steps and at every stop (:mod:`.state`). Stops on SIGINT / SIGTERM (after the
current step), ``max_steps`` or ``max_minutes``; a budget stop judges the candidate once more when at least half an
``eval_every`` was trained since the last judgement. Reads and pushes are admin ops run between the server's
batches; every target forward the adapter asks for goes through the score queue's per-iteration budget.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from specopd_trainer.adapt import auto
from specopd_trainer.adapt.buffer import TrafficBuffer, TrafficSequence
from specopd_trainer.adapt.config import AdaptConfig
from specopd_trainer.adapt.features import FeatureSource
from specopd_trainer.adapt.guard import compare, walk_rows, worse
from specopd_trainer.adapt.judge import judge
from specopd_trainer.adapt.fleet_reader import reader_for
from specopd_trainer.adapt.reader import ServedItem
from specopd_trainer.adapt.report import StatusPrinter, metrics_row, status_line, summary
from specopd_trainer.adapt.slices import SliceKeyer, majority_header
from specopd_trainer.adapt.state import AdaptState
from specopd_trainer.adapt.stops import install_signals, restore_signals
from specopd_trainer.adapt.view import TrainView
from specopd_trainer.algorithms.registry import NothingToTrain
from specopd_trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from specopd_trainer.loops.common import step_generator

PushFn = Callable[[Any, str], Any]  # push(drafter, version): hot-swap into the server (raises on refusal)
MAX_PAGES_PER_ITERATION = 8


class AdaptError(RuntimeError):
    """The adapter cannot run (unknown algorithm, server without a spool, ...); one line for the user."""


class Adapter:
    """One adaptation run against the server behind ``client`` (admin key), training ``drafter`` in place.

    Args:
        push: ``push(drafter, version)`` hot-swaps a drafter. serving_version: ``() -> str`` the server's version.
        run_dir: buffers, checkpoints, ``metrics.jsonl``. progress: print the status line.
    """

    def __init__(self, client, drafter, run_dir: str | Path, cfg: AdaptConfig, *, push: PushFn,
                 serving_version: Callable[[], Optional[str]], progress: bool = True, sleep=time.sleep):
        from specopd_trainer.algorithms import registry

        if cfg.algorithm != "auto" and registry.get(cfg.algorithm).adapt is None:
            raise AdaptError(f"algorithm {cfg.algorithm!r} cannot learn from traffic; choose auto or one of "
                             f"{', '.join(registry.adaptive())}")
        self.cfg, self.client, self.drafter, self.push_fn = cfg, client, drafter, push
        self.run_dir, self.sleep, self._serving_version = Path(run_dir), sleep, serving_version
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.train_buf = TrafficBuffer(self.run_dir / "train", int(cfg.train_buffer_mb * 2**20))
        self.hold_buf = TrafficBuffer(self.run_dir / "holdout", int(cfg.holdout_buffer_mb * 2**20),
                                      per_slice=cfg.holdout_per_slice)
        self.rehearsal_buf = TrafficBuffer(self.run_dir / "rehearsal", int(cfg.train_buffer_mb * 2**18),
                                           per_slice=cfg.rehearsal_per_slice)  # older traffic per slice (.view)
        self.features = FeatureSource(client, drafter.spec.target_layer_ids, cfg.features)
        self.params = [p for p in drafter.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
        self.state = AdaptState()
        self.deployed = copy.deepcopy(drafter)  # the drafter the server serves (weights), for the guard's walks
        self.anchor = copy.deepcopy(drafter).requires_grad_(False)  # the run's start drafter (retention term)
        self.previous: Optional[Dict[str, torch.Tensor]] = None  # the one before it (rollback)
        self._fresh = False
        self._resume()
        self.features.counts.update({k: int(v) for k, v in self.state.features.items()})
        self.reader = reader_for(client, self.state, cfg, int(drafter.spec.vocab_size))  # a fleet: one per worker
        if self._fresh and cfg.start_at == "newest":  # a new run skips what the spool(s) hold now
            self.reader.skip_to_newest()
        self._train_view, self._rehearsal_view = self.train_buf.sequences, self.rehearsal_buf.by_slice()
        if cfg.algorithm == "auto" and not self.state.schedule:
            self.state.schedule = auto.new_schedule()
        self.step_fn = self._make_step(self.algorithm)
        self._dep_cache: Dict[str, dict] = {}
        self._start_cache: Dict[str, dict] = {}  # the start drafter's walks (it never changes)
        self._stop: Optional[str] = None
        self._loss: Optional[float] = None
        self.status = StatusPrinter(cfg.log_every_s, enabled=progress)

    @property
    def algorithm(self) -> str:
        """The algorithm training now (``--algorithm``, or auto's current phase)."""
        return self.state.schedule.get("algorithm", "sft") if self.cfg.algorithm == "auto" else self.cfg.algorithm

    def _make_step(self, name: str):
        from specopd_trainer.algorithms import registry
        from specopd_trainer.algorithms.registry import AdaptContext

        alg = registry.get(name)
        if alg.adapt is None:
            raise AdaptError(f"algorithm {name!r} cannot learn from traffic")
        options = (self.cfg.algorithm_options if name == "sft" or self.cfg.algorithm != "auto"
                   else self.cfg.auto_options.get(name, {}))
        ctx = AdaptContext(drafter=self.drafter, client=self.client, train=TrainView(self),
                           fresh_versions=self.fresh_versions, anchor=self.anchor, retain=self.cfg.retain)
        return alg.adapt(ctx, alg.make_config(**options))

    def advance_schedule(self) -> Optional[str]:
        """auto: after a judgement, switch from SFT to the table's choice once the held-out gain has flattened
        (:mod:`.auto`); the same retention (rehearsal share) goes on. Returns the new algorithm, else None."""
        if self.cfg.algorithm != "auto":
            return None
        cfg = self.cfg
        arch = getattr(type(self.drafter), "drafter_name", "dflash")
        new = auto.advance(self.state.schedule, self.state.verdicts, k=cfg.auto_flat_verdicts,
                           threshold=cfg.auto_flat_gain, arch=arch, temperature=cfg.serving_temperature,
                           step=self.state.step)
        if new is not None:
            self.step_fn = self._make_step(new)
        if self.state.schedule.get("switched_at_step") == self.state.step:
            self.state.note_verdict({"kind": "schedule", "step": self.state.step, **self.state.schedule})
            self._show(force=True)
        return new

    # ---- state -------------------------------------------------------------------------------------------------
    def _resume(self) -> None:
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            version = self._serving_version() or "initial"
            self.state.deployed.append({"version": version, "step": 0, "t_s": 0.0, "why": "serving at start"})
            self._fresh = True
            return
        saved = load_checkpoint(ckpt)
        self.drafter.load_state_dict(saved["drafter"])
        self.opt.load_state_dict(saved["optimizer"])
        self.deployed.load_state_dict(saved["deployed"])
        if "anchor" in saved:
            self.anchor.load_state_dict(saved["anchor"])
        self.previous = saved.get("previous")
        self.state = AdaptState.from_dict(saved["state"])
        serving = self._serving_version()
        if serving != self.state.deployed_version:  # the server restarted (or someone swapped): serve ours again
            self._push(self.deployed, f"{self.state.deployed_version}-restored",
                       f"restored: the server served {serving!r}")

    def checkpoint(self) -> None:
        """Atomic checkpoint of the candidate, optimiser, deployed and previous weights and the state."""
        self.state.features = dict(self.features.counts)
        save_checkpoint(self.run_dir, self.state.step, {
            "drafter": self.drafter.state_dict(), "optimizer": self.opt.state_dict(),
            "deployed": self.deployed.state_dict(), "anchor": self.anchor.state_dict(), "previous": self.previous,
            "state": self.state.as_dict(),
            "config": self.cfg.model_dump()})

    def fresh_versions(self) -> set:
        """The deployed version and the ``max_staleness`` before it (records they served are replayable)."""
        versions = [d["version"] for d in self.state.deployed]
        return set(versions[-(self.cfg.max_staleness + 1):])

    # ---- traffic -----------------------------------------------------------------------------------------------
    def ingest(self) -> int:
        """Read what the spool holds after the cursor (up to a few pages); returns how many items were added."""
        added = 0
        for _ in range(MAX_PAGES_PER_ITERATION):
            items = self.reader.read()
            if items:
                added += self._add(items)
            if not self.reader.backlog:
                break
        return added

    def _add(self, items: List[ServedItem]) -> int:
        known = self.train_buf.keys() | self.hold_buf.keys()
        items = [it for it in items if it.key not in known]
        if not items:
            return 0
        feats = self.features.features(items)
        keyer = self._slice_keyer([it.input_ids[:it.prompt_len] for it in items])
        train, hold = [], []
        for it in items:
            seq = TrafficSequence(id=it.key, domain="traffic", token_ids=torch.tensor(it.input_ids, dtype=torch.long),
                                  features=feats[it.key], prompt_len=it.prompt_len, records=tuple(it.trace),
                                  served_by=tuple(it.versions), worker=it.worker,
                                  slice=keyer.slice_of(it.input_ids[:it.prompt_len]))
            (hold if it.held_out else train).append(seq)
            self.state.traffic_tokens_seen += len(it.input_ids)
        self.state.traffic_tokens_trained += sum(len(s.token_ids) - s.prompt_len for s in train)
        n = self.train_buf.add(train) + self.hold_buf.add(hold)
        self.rehearsal_buf.add(train)
        self._train_view, self._rehearsal_view = self.train_buf.sequences, self.rehearsal_buf.by_slice()
        return n

    def _slice_keyer(self, prompts) -> SliceKeyer:
        """The slice keyer; its header is frozen at the first page read (config, else that page's majority)."""
        cfg = self.cfg
        if self.state.slice_header is None:
            self.state.slice_header = list(cfg.slice_header) or majority_header(prompts)
        return SliceKeyer(self.state.slice_header, cfg.slice_prefix_tokens, cfg.slice_min_seen, cfg.max_slices,
                          self.state.slice_seen)

    # ---- training ----------------------------------------------------------------------------------------------
    def train_step(self) -> bool:
        """One optimiser step; False when the algorithm had nothing to train on yet."""
        cfg = self.cfg
        lr = cfg.lr * min(1.0, (self.state.step + 1) / max(1, cfg.warmup_steps))
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        try:
            loss, metrics = self.step_fn(step_generator(cfg.seed, self.state.step, 0))
        except NothingToTrain:  # e.g. Draft-OPD without fresh blocks yet: wait for traffic
            self.opt.zero_grad(set_to_none=True)
            return False
        if not math.isfinite(loss):
            self._reset_candidate("non-finite loss")
            return True
        torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.opt.step()
        self.state.step += 1
        self.state.trained_tokens += int(metrics.get("supervised_tokens", 0))
        self._loss = loss
        return True

    def _reset_candidate(self, why: str) -> None:
        self.state.note_verdict({"kind": "candidate_reset", "step": self.state.step, "why": why})
        self.drafter.load_state_dict(self.deployed.state_dict())
        self.opt = torch.optim.AdamW(self.params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay,
                                     betas=(0.9, 0.95))
        self.state.candidate_resets += 1

    # ---- deploy guard ------------------------------------------------------------------------------------------
    def judge(self) -> Optional[Dict[str, Any]]:
        """Judge the candidate (:func:`specopd_trainer.adapt.judge.judge`: every check reported, a check that
        could not run blocks); push it or roll back. The verdict dict, or None when nothing is held out yet."""
        return judge(self)

    def next_version(self) -> str:
        """``adapt-<run>-<n>`` (a run dir already named ``adapt-...`` is not prefixed twice)."""
        name = self.run_dir.name
        return f"{name if name.startswith('adapt-') else 'adapt-' + name}-{self.state.pushes + 1}"

    def deploy_candidate(self, version: str, why: str) -> bool:
        """Push the candidate; on success it is the deployed drafter (the one before kept for a rollback)."""
        if not self._push(self.drafter, version, why):
            return False
        self.previous = copy.deepcopy(self.deployed.state_dict())
        self.deployed.load_state_dict(self.drafter.state_dict())
        self._dep_cache.clear()
        self.state.pushes += 1
        return True

    def _push(self, drafter, version: str, why: str) -> bool:
        try:
            self.push_fn(drafter, version)
        except Exception as exc:  # the server refused or is down: keep serving what it serves, count, go on
            self.state.push_errors += 1
            self.state.note_verdict({"kind": "push_error", "step": self.state.step, "error": str(exc)[:300]})
            return False
        self.state.deployed.append({"version": version, "step": self.state.step,
                                    "t_s": round(self.state.wall_s, 1), "why": why})
        return True

    # ---- the loop ----------------------------------------------------------------------------------------------
    def request_stop(self, why: str) -> None:
        self._stop = why

    def run(self) -> Dict[str, Any]:
        """Run until stopped; returns :func:`specopd_trainer.adapt.report.summary`."""
        cfg = self.cfg
        handlers = install_signals(self.request_stop)
        t0, wall0 = time.monotonic(), self.state.wall_s
        last_ckpt, last_row, last_judged = self.state.step, 0.0, self.state.step
        try:
            while self._stop is None:
                self.state.wall_s = wall0 + time.monotonic() - t0
                if cfg.max_minutes is not None and time.monotonic() - t0 > cfg.max_minutes * 60:
                    self._stop = "max_minutes"
                    break
                if cfg.max_steps is not None and self.state.step >= cfg.max_steps:
                    self._stop = "max_steps"
                    break
                t = time.monotonic()
                self.ingest()
                self.state.time("ingest", time.monotonic() - t)
                ready = self.train_buf.response_tokens() >= cfg.min_train_tokens
                t = time.monotonic()
                trained = ready and self.train_step()
                self.state.time("train", time.monotonic() - t)
                if not trained:
                    self._show()
                    t = time.monotonic()
                    self.sleep(cfg.poll_s)
                    self.state.time("wait", time.monotonic() - t)
                    continue
                if self.state.step % cfg.eval_every == 0:
                    t = time.monotonic()
                    self.judge()
                    last_judged = self.state.step
                    self.state.time("judge", time.monotonic() - t)
                    self.advance_schedule()
                if self.state.step - last_ckpt >= cfg.ckpt_every:
                    self.checkpoint()
                    last_ckpt = self.state.step
                self._show()
                if time.monotonic() - last_row >= cfg.log_every_s:
                    last_row = time.monotonic()
                    self._metrics_row()
            if self.state.step - last_judged >= max(1, cfg.eval_every // 2):  # a budget stop: judge what was trained
                t = time.monotonic()
                self.judge()
                self.state.time("judge", time.monotonic() - t)
        finally:
            restore_signals(handlers)
            self.state.wall_s = wall0 + time.monotonic() - t0
            self.checkpoint()
            self._show(force=True)
            self.status.close()
        return summary(self.state, train_items=len(self.train_buf), holdout_items=len(self.hold_buf),
                       stopped_by=self._stop or "error", buffers={"train": self.train_buf.counts,
                                                                  "holdout": self.hold_buf.counts})

    def _show(self, force: bool = False) -> bool:
        line = status_line(self.state, train_items=len(self.train_buf), holdout_items=len(self.hold_buf),
                           loss=self._loss)
        sched = auto.describe(self.state.schedule)
        return self.status.show(line + (f" | {sched}" if sched else ""), force=force)

    def _metrics_row(self) -> None:
        metrics_row(self.run_dir / "metrics.jsonl", self.state, loss=self._loss, train_items=len(self.train_buf),
                    holdout_items=len(self.hold_buf))
