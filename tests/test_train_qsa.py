"""The trainer end to end against the tiny QSA-GDN target (Qwen4-Exp architecture: Gated DeltaNet + QSA sparse
attention) served by SGLang on CPU (issue 23 part 4): the checks of tests/_train_e2e.py on the shared SPECOPD
server of tests/test_serve_qsa.py (random block-4 drafter, admin key). The context features come from
``/specopd/score_trees`` (QSA layers: one selection per tree node; features: each captured layer's mixed attention
input, :mod:`sglang_specopd.server.qwen4_exp_features`); the training prompts are short, so the contexts cross the
QSA budget of 32 tokens and the sparse regime is exercised.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _train_e2e import greedy, sft_then_specopd_push_hot_and_serve
from support.qsa_server import QSA_ADMIN_KEY, QSA_BLOCK_SIZE, qsa_specopd_server  # noqa: F401  (a fixture)

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def qsa_train_server(qsa_specopd_server):  # noqa: F811
    """The shared SPECOPD server on the QSA target, its greedy outputs before any swap in ``extra["train_greedy"]``."""
    qsa_specopd_server.extra["train_greedy"] = greedy(qsa_specopd_server.url)
    return qsa_specopd_server


def test_sft_then_specopd_push_hot_and_serve(qsa_train_server, qsa_target: Path, tmp_path: Path) -> None:
    sft_then_specopd_push_hot_and_serve(qsa_train_server, qsa_target, tmp_path, admin_key=QSA_ADMIN_KEY,
                                        block_size=QSA_BLOCK_SIZE, label="qsa")
