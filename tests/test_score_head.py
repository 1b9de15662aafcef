"""The score_trees LM head (``sglang_specopd.server.scoring.forward.head_outputs``): per-row top-k log-probs, log-sum-exp
and full log-probs, computed in row blocks, equal the plain formulas (log_softmax over the whole vocabulary)."""

from __future__ import annotations

import pytest
import torch

from sglang_specopd.server.scoring.forward import HEAD_ROW_BLOCK, head_outputs
from _tp_head_worker import pad_rows, tp_rank
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


# ----------------------------------------------------------------------------- tensor parallelism (2 gloo ranks)

@pytest.mark.parametrize(("vocab", "top_k"), [(301, 5), (7, 6)])
def test_vocab_sharded_head_over_two_gloo_ranks_matches_unsharded(vocab: int, top_k: int, tmp_path) -> None:
    """A head of ``vocab`` rows split over 2 ranks (torch.distributed gloo, spawned processes), padded as SGLang
    pads it (301 -> 304 rows: rank 1 holds 3 padding rows; 7 -> 8: rank 1 holds 3 real ids, fewer than top_k):
    every rank returns the unsharded top-k ids and log-probs, log-sum-exp and full log-probs."""
    import torch.multiprocessing as mp

    gen = torch.Generator().manual_seed(vocab)
    rows = HEAD_ROW_BLOCK + 3  # two row blocks
    h, head = torch.randn(rows, 16, generator=gen), torch.randn(vocab, 16, generator=gen)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=tp_rank, args=(r, 2, init, h, head, top_k, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = {rank: {k: torch.from_numpy(v) for k, v in out.items()}
           for rank, out in (queue.get(timeout=300) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    logits = h @ head.t()
    ref = torch.log_softmax(logits, dim=-1)
    vals, idx = ref.topk(min(top_k, vocab), dim=-1)
    for rank in (0, 1):
        out = got[rank]
        assert torch.equal(out["topk_ids"], idx), rank
        torch.testing.assert_close(out["topk_logprobs"], vals, rtol=0, atol=1e-5)
        torch.testing.assert_close(out["lse"], torch.logsumexp(logits, dim=-1), rtol=0, atol=1e-5)
        assert out["logprobs"].shape == (rows, vocab)
        torch.testing.assert_close(out["logprobs"], ref, rtol=0, atol=1e-5)


def test_one_rank_ignores_padding_rows() -> None:
    """A single-rank head with padding rows (SGLang pads the vocabulary to a multiple of 64): only the real ids
    are scored."""
    from sglang_specopd.server.scoring.head import VocabShard, shard_head_outputs

    gen = torch.Generator().manual_seed(3)
    h, head = torch.randn(4, 8, generator=gen), torch.randn(10, 8, generator=gen)
    out = shard_head_outputs(h, pad_rows(head, 64), ["topk", "logprobs"], 3, torch.float32, VocabShard(0, 10, 10))
    ref = torch.log_softmax(h @ head.t(), dim=-1)
    assert out["logprobs"].shape == (4, 10) and torch.equal(out["topk_ids"], ref.topk(3).indices)
    torch.testing.assert_close(out["logprobs"], ref, rtol=0, atol=1e-5)
