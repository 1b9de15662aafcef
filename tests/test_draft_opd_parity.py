"""Parity against a live server: Draft-OPD's replay reproduces, at T=0, the block the server proposed at every
recorded anchor (the drafter recomputed from the context features the same ``score_trees`` call returns), and
one Draft-OPD step trains on those blocks.

One CPU SPECOPD server (tiny Llama target, fp32, torch_native) with the visibly non-trivial block-8 drafter of
:mod:`test_trainer_parity` (weights 10x the init scale, so the argmax depends on context): that module's server,
shared (``parity_server``). Rollouts go through the
Draft-OPD live source (both prompts in flight at once)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from _replay_checks import check_replay
from support.parity_server import BLOCK_SIZE, parity_server  # noqa: F401  (parity_server: a shared fixture)

pytestmark = pytest.mark.server

PROMPTS = ("def add(a, b):\n    return", "Return the sum of the arguments.", "Hello world")
NEW_TOKENS = 24


def test_replay_reproduces_the_servers_t0_proposals(parity_server, tiny_target: Path) -> None:
    from transformers import AutoTokenizer

    from specopd_trainer.algorithms.draft_opd.replay import draft_opd_step, select_blocks
    from specopd_trainer.algorithms.draft_opd.rollouts import live_source
    from specopd_trainer.algorithms.sequential_opd.rollouts import (block_rows, pack_recorded_blocks,
                                                                    score_recorded_blocks)
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.dflash import DFlashDrafter

    tok = AutoTokenizer.from_pretrained(tiny_target)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    assert parity_server.spec.block_size == BLOCK_SIZE
    drafter = DFlashDrafter.from_pretrained(Path(parity_server.spec.drafter_path), tiny_target)
    g, layers = drafter.block_size - 1, list(drafter.spec.target_layer_ids)
    with SpecOPDClient(parity_server.url) as client:
        source = live_source(client, prompts, block_size=BLOCK_SIZE, rollout_prompts=len(prompts) * 2,
                             max_new_tokens=NEW_TOKENS, temperature=0.0, concurrency=len(prompts))
        rollouts = source(torch.Generator().manual_seed(0))
        assert all(r.records for r in rollouts)
        blocks = [pack_recorded_blocks(r.token_ids, [x.as_dict() for x in r.records], g) for r in rollouts]
        scored = score_recorded_blocks(client, blocks, BLOCK_SIZE, layers)
        rows = []
        with torch.no_grad():
            for r, b, sc in zip(rollouts, blocks, scored):
                p_rows, q, _ = block_rows(drafter, b, sc, "float32")
                ours = q.view(len(r.records), g, -1).argmax(-1).tolist()
                # the target's p at (block n, slot k) is its row_index[n, k - 1] row: at T=0 its argmax is the
                # proposed token on every accepted slot and differs from it on the first rejected one
                p_top = p_rows.argmax(-1)[b.packed.row_index].tolist()
                rows += list(zip(r.records, ours, p_top))
        assert check_replay(rows, g) >= len(rollouts) * (NEW_TOKENS // BLOCK_SIZE)
        # the versions per record (or per request) are present, and one Draft-OPD step trains on error anchors
        selected = select_blocks(rollouts, g, "error", 64, torch.Generator().manual_seed(0))
        assert selected, "a random drafter must have rejected slots"
        loss, m = draft_opd_step(drafter, client, selected, layers, head_dtype="float32")
        loss.backward()
        assert torch.isfinite(loss) and loss.item() > 0 and m["rejected_tokens"] > 0
        assert drafter.fc.weight.grad is not None and drafter.fc.weight.grad.abs().sum() > 0
    assert all(x.drafter_version is not None for r in rollouts for x in r.records)
