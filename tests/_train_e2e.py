"""The trainer end to end against a tiny target served by a shared SPECOPD server on CPU: SFT, a few SpecOPD steps,
both pushed hot, the pushed drafter serving losslessly and better (tests/test_train_hybrid_gdn.py,
tests/test_train_qsa.py). Checked:

* SFT 40 steps: the ce_decay loss falls (mean of the last 5 steps under 0.75x the first 5 steps');
* SpecOPD a few steps: every branch tree scored by the server, finite losses and acceptances;
* pushed hot: the server reports the new drafter version and its greedy output is the same token for token as
  before the swap (speculative decoding at T=0 is lossless), with verify steps taken by the new drafter;
* the pushed drafter serves: on a training prompt the server regenerates the cached response and accepts more than
  1.2 tokens per verify step (the fixtures' random drafters: ~1.0-1.07).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List

import httpx

from sglang_specopd.wire.protocol import DRAFTER_INFO_PATH

GREEDY_PROMPTS = ([504, 3575, 282, 4649, 314], [1, 4093, 10633, 30, 198])
GREEDY_TOKENS = 16
DOMAINS = ("dialogue", "coding")
PER_DOMAIN = 4  # 8 responses: 6 train, 2 held out
MAX_NEW_TOKENS = 32
SFT_STEPS = 40
SPECOPD_STEPS = 3


def greedy(url: str) -> List[dict]:
    """The server's greedy responses (ids and meta info) to :data:`GREEDY_PROMPTS`."""
    out = []
    for ids in GREEDY_PROMPTS:
        r = httpx.post(url + "/generate", json={"input_ids": ids, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": GREEDY_TOKENS, "ignore_eos": True}}, timeout=300)
        assert r.status_code == 200, r.text[:500]
        out.append(r.json())
    return out


def info(url: str) -> dict:
    r = httpx.get(url + DRAFTER_INFO_PATH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def rows_of(run: Path) -> List[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def sft_then_specopd_push_hot_and_serve(server, target: Path, tmp_path: Path, *, admin_key: str, block_size: int,
                                        label: str, hidden: int = 256) -> None:
    """The check of the module docstring against ``server`` (a shared SPECOPD server whose ``extra`` holds
    ``drafter``, its start-up drafter's directory, and ``train_greedy``, :func:`greedy` before any swap) serving
    ``target``; pushed versions are named ``<label>-<algorithm>-step<N>``."""
    import torch
    from transformers import AutoTokenizer

    from specopd_trainer.algorithms import registry
    from specopd_trainer.algorithms.registry import TrainContext
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.registry import drafter_class_for_checkpoint
    from specopd_trainer.pipeline import prepare_sequences, push_drafter

    url = server.url
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(target)
    path = server.extra["drafter"]
    drafter = drafter_class_for_checkpoint(path).from_pretrained(path, target)
    swaps0 = info(url)["swaps"]
    pushed: Dict[str, dict] = {}

    def push(name: str):
        def _push(step: int, d) -> None:
            version = f"{label}-{name}-step{step}"
            pushed[version] = push_drafter(url, d, version, admin_key)
        return _push

    with SpecOPDClient(url) as client:
        train, holdout = prepare_sequences(client, tok, drafter.spec.target_layer_ids, tmp_path / "data",
                                           domains=DOMAINS, per_domain=PER_DOMAIN, max_new_tokens=MAX_NEW_TOKENS,
                                           concurrency=2)
        assert len(train) + len(holdout) == len(DOMAINS) * PER_DOMAIN and holdout
        n_layers = len(drafter.spec.target_layer_ids)
        for s in train + holdout:
            assert s.features.shape == (len(s.token_ids), n_layers * hidden) and torch.isfinite(s.features).all()

        sft = registry.get("sft")
        # 16 anchors per sequence at LR 1e-3 (the default): 10.7 -> 6.2 over 40 steps on these responses (4 anchors
        # or LR 1e-2: ~10 at step 40; the target is random, so its responses are random-looking tokens to memorise)
        sft_cfg = sft.make_config(steps=SFT_STEPS, seqs_per_step=2, anchors_per_seq=16, lr=1e-3, warmup_steps=2,
                                  log_every=1, ckpt_every=SFT_STEPS, eval_every=SFT_STEPS, eval_sequences=2)
        sft.run(TrainContext(drafter, client, tmp_path / "sft", train=train, holdout=holdout, push=push("sft"),
                             progress=False), sft_cfg)
        losses = [r["loss"] for r in rows_of(tmp_path / "sft") if "loss" in r]
        assert len(losses) == SFT_STEPS and all(math.isfinite(x) for x in losses)
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        print(f"{label} SFT: loss {first:.3f} (first 5 steps) -> {last:.3f} (last 5 steps)")
        assert last < 0.75 * first, losses
        assert info(url)["version"] == f"{label}-sft-step{SFT_STEPS}"

        specopd = registry.get("specopd")
        scfg = specopd.make_config(steps=SPECOPD_STEPS, seqs_per_step=2, anchors_per_seq=2, branches=3,
                                   root_anchors_per_seq=4, warmup_steps=1, push_every=0, ckpt_every=SPECOPD_STEPS)
        report = specopd.run(TrainContext(drafter, client, tmp_path / "specopd", train=train + holdout,
                                          push=push("specopd"), progress=False), scfg)
    rows = rows_of(tmp_path / "specopd")
    assert [r["step"] for r in rows] == list(range(1, SPECOPD_STEPS + 1))
    for r in rows:
        assert math.isfinite(r["loss"]) and r["step_supervised_tokens"] > 0, r
        assert len(r["alpha"]) == block_size - 1 and all(0.0 <= a <= 1.0 for a in r["alpha"]), r
    assert report.summary["steps"] == SPECOPD_STEPS
    print(f"{label} SpecOPD: losses {[round(r['loss'], 4) for r in rows]}, est. tau {rows[-1]['est_tau']:.3f}")

    # pushed hot twice (SFT's end, SpecOPD's end): the server serves the last version, losslessly
    version = f"{label}-specopd-step{SPECOPD_STEPS}"
    assert list(pushed) == [f"{label}-sft-step{SFT_STEPS}", version]
    now = info(url)
    assert now["version"] == version and now["swaps"] == swaps0 + 2, now
    after = greedy(url)
    for before_resp, after_resp in zip(server.extra["train_greedy"], after):
        assert after_resp["output_ids"] == before_resp["output_ids"]
        assert after_resp["meta_info"]["spec_verify_ct"] >= 1, after_resp["meta_info"]
    print("accept lengths before / after:", [r["meta_info"].get("spec_accept_length") for r in
                                             server.extra["train_greedy"]],
          [r["meta_info"].get("spec_accept_length") for r in after])
    # the trained drafter serves: on a training prompt the server regenerates the cached greedy response token for
    # token, accepting more than one token per verify step on average (the random drafter of the fixture: ~1.07)
    seq = train[0]
    want = seq.token_ids[seq.prompt_len:].tolist()
    r = httpx.post(url + "/generate", json={"input_ids": seq.token_ids[:seq.prompt_len].tolist(), "sampling_params": {
        "temperature": 0.0, "max_new_tokens": len(want)}}, timeout=300)
    assert r.status_code == 200, r.text[:500]
    assert r.json()["output_ids"] == want
    accept = r.json()["meta_info"]["spec_accept_length"]
    print(f"trained drafter on a training prompt: accept length {accept:.2f}")
    assert accept > 1.2
