"""The trainer end to end against the tiny hybrid Gated DeltaNet target served by SGLang on CPU (issue 21 part 4).

One SPECOPD server (the tiny Qwen3-Next target of ``tests/test_serve_hybrid_gdn.py``: three GDN layers per
full-attention layer, fp32; a random block-4 DFlash drafter; an admin key: its shared ``hybrid_specopd_server``,
serving its start-up drafter when this module starts), driven through the same trainer entry points as the main
job (:mod:`sglang_specopd.app.main_job.run`): :func:`specopd_trainer.pipeline.prepare_sequences` (responses generated
by the server, context features from ``/specopd/score_trees`` on the hybrid path), the registry's ``sft`` and
``specopd`` algorithms, :func:`specopd_trainer.pipeline.push_drafter`. Checked:

* SFT 40 steps: the ce_decay loss falls (mean of the last 5 steps under 0.75x the first 5 steps');
* SpecOPD a few steps: every branch tree scored by the server's GDN replay path, finite losses and acceptances;
* pushed hot: the server reports the new drafter version and its greedy output is the same token for token as
  before the swap (speculative decoding at T=0 is lossless), with verify steps taken by the new drafter;
* the pushed drafter serves: on a training prompt the server regenerates the cached response and accepts more than
  one token per verify step (the fixture's random drafter: ~1.07);
* the trainer package names no target kind (no GDN / Qwen3-Next / linear-attention code path in it).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _train_e2e import greedy, sft_then_specopd_push_hot_and_serve
from support.hybrid_server import BLOCK_SIZE, HYBRID_ADMIN_KEY, hybrid_specopd_server  # noqa: F401  (a fixture)

pytestmark = pytest.mark.server

ADMIN_KEY = HYBRID_ADMIN_KEY
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hybrid_train_server(hybrid_specopd_server):  # noqa: F811
    """The shared SPECOPD server on the hybrid target (random block-4 drafter, admin key), serving its start-up
    drafter; ``extra["drafter"]`` is that drafter's directory, ``extra["train_greedy"]`` the greedy outputs (ids and
    meta info) before any swap of this module."""
    hybrid_specopd_server.extra["train_greedy"] = greedy(hybrid_specopd_server.url)
    return hybrid_specopd_server


def test_trainer_names_no_target_kind() -> None:
    """The trainer talks to every target through the same wire protocol: no hybrid / GDN / QSA branch in its code."""
    pattern = re.compile(r"gdn|gated.?delta|qwen3.?next|qwen4|qsa|linear_attention|mamba", re.IGNORECASE)
    hits = [f"{p.relative_to(REPO)}:{i + 1}" for p in sorted((REPO / "trainer").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines()) if pattern.search(line)]
    assert hits == []


def test_sft_then_specopd_push_hot_and_serve(hybrid_train_server, hybrid_target: Path, tmp_path: Path) -> None:
    sft_then_specopd_push_hot_and_serve(hybrid_train_server, hybrid_target, tmp_path, admin_key=ADMIN_KEY,
                                        block_size=BLOCK_SIZE, label="hybrid")
