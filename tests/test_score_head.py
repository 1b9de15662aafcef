"""The score_trees LM head (``sglang_specopd.server.scoring.head_outputs``): per-row top-k log-probs, log-sum-exp
and full log-probs, computed in row blocks, equal the plain formulas (log_softmax over the whole vocabulary)."""

from __future__ import annotations

import pytest
import torch

from sglang_specopd.server.scoring import HEAD_ROW_BLOCK, head_outputs
from sglang_specopd.wire.protocol import ScoreTreesRequest


def _req(returns, top_k=5) -> ScoreTreesRequest:
    return ScoreTreesRequest(references=[{"input_ids": [1, 2, 3], "trees": [{"anchor": 1, "branches": [[4]]}]}],
                             block_size=4, returns=returns, top_k=top_k)


@pytest.mark.parametrize("rows", [1, HEAD_ROW_BLOCK - 1, HEAD_ROW_BLOCK, 2 * HEAD_ROW_BLOCK + 3])
def test_blocked_head_equals_log_softmax(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    h, head = torch.randn(rows, 16, generator=gen), torch.randn(300, 16, generator=gen)
    out = head_outputs(h, head, _req(["topk", "logprobs"]), torch.float32)
    ref = torch.log_softmax(h @ head.t(), dim=-1)
    vals, idx = ref.topk(5, dim=-1)
    assert out["topk_ids"].shape == (rows, 5) and out["topk_ids"].dtype == torch.int64
    assert torch.equal(out["topk_ids"], idx)
    torch.testing.assert_close(out["topk_logprobs"], vals, rtol=0, atol=1e-5)
    torch.testing.assert_close(out["lse"], torch.logsumexp(h @ head.t(), dim=-1), rtol=0, atol=1e-5)
    torch.testing.assert_close(out["logprobs"], ref, rtol=0, atol=1e-5)
    # the probabilities of each row sum to one, and the top-1 is the row's argmax
    torch.testing.assert_close(out["logprobs"].exp().sum(-1), torch.ones(rows), rtol=0, atol=1e-5)
    assert torch.equal(out["topk_ids"][:, 0], (h @ head.t()).argmax(-1))


def test_hand_case_two_tokens() -> None:
    # logits [ln 3, 0] -> probabilities [3/4, 1/4]; lse = ln 4
    h, head = torch.tensor([[1.0]]), torch.tensor([[float(torch.tensor(3.0).log())], [0.0]])
    out = head_outputs(h, head, _req(["topk"], top_k=2), torch.float32)
    assert out["topk_ids"].tolist() == [[0, 1]]
    torch.testing.assert_close(out["topk_logprobs"], torch.tensor([[0.75, 0.25]]).log(), rtol=0, atol=1e-6)
    torch.testing.assert_close(out["lse"], torch.tensor([4.0]).log(), rtol=0, atol=1e-6)
    assert "logprobs" not in out and "hidden" not in out
