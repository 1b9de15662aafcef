"""``POST /specopd/score_trees`` on the tiny hybrid Gated DeltaNet target served by SGLang on CPU (issue 21 part 3).

One SPECOPD server (the tiny Qwen3-Next target of ``tests/test_serve_hybrid_gdn.py``, fp32, a random block-4
drafter; its shared ``hybrid_specopd_server``) with a prefix cache and a piece budget configured, both of which a
hybrid target does not use (:mod:`sglang_specopd.server.scoring.gdn`: replies say ``prefix_cache: "off"``,
references run whole):

* exactness: every anchor row and tree node equals scoring ``prefix[:anchor + 1] + its branch`` as its own
  sequence through the same endpoint (GDN states replayed for that sequence alone), and SGLang's own ``/generate``
  log-probs (its GDN backend and mamba state pool) for a few of them; the max abs difference is printed;
* context features equal transformers' hidden states of the same checkpoint;
* bad trees (deeper than the block, parents that do not form a tree) get one 400 each with the reason, and the
  server keeps serving with unchanged greedy output.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import List

import httpx
import pytest
import torch

from support.hybrid_server import BLOCK_SIZE, HYBRID_ADMIN_KEY, hybrid_specopd_server  # noqa: F401  (a shared fixture)
from support.score_trees import assert_4xx, node_paths, post_score, random_tree, score
from sglang_specopd.wire.protocol import ScoreTreesRequest

pytestmark = pytest.mark.server

TOL = 1e-4  # fp32
SCORE_BLOCK = 5  # the exactness request's block size (paths of up to 4 tokens; the serving drafter's is 4)
TOP_K = 8
FEATURE_LAYERS = [0, 3, 5]  # a GDN layer, the first full-attention layer, a GDN layer after it
GREEDY_PROMPT = [504, 3575, 282, 4649, 314]
GREEDY_TOKENS = 12


@pytest.fixture(scope="module")
def hybrid_server(hybrid_specopd_server):  # noqa: F811
    """The shared SPECOPD server on the hybrid target (a prefix cache and a 32-row piece budget configured);
    ``extra["score_greedy"]``: its greedy output ids before this module scores anything."""
    hybrid_specopd_server.extra["score_greedy"] = _greedy(hybrid_specopd_server.url)
    return hybrid_specopd_server


def _greedy(url: str) -> List[int]:
    r = httpx.post(url + "/generate", json={"input_ids": GREEDY_PROMPT, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": GREEDY_TOKENS, "ignore_eos": True}}, timeout=300)
    assert r.status_code == 200, r.text[:500]
    return r.json()["output_ids"]


def _request(vocab: int) -> ScoreTreesRequest:
    """Two references: one longer than the replay's 64-token chunk (anchors on both sides of the boundary) with
    chain branches, one with random trees (siblings, paths of up to SCORE_BLOCK - 1 tokens)."""
    rng = random.Random(0)
    long_ref = [rng.randrange(5, vocab) for _ in range(70)]
    short_ref = [rng.randrange(5, vocab) for _ in range(9)]
    chains = [{"anchor": a, "branches": [[rng.randrange(5, vocab) for _ in range(rng.randint(1, 3))]
                                         for _ in range(2)]} for a in (0, 4, 63, 64, 69)]
    trees = [{"anchor": a, "tokens": t, "parents": p}
             for a in (1, 5, 8) for t, p in [random_tree(rng, vocab, 5, max_depth=SCORE_BLOCK - 1)]]
    trees.append({"anchor": 3, "tokens": [10, 11, 12, 13, 14, 15], "parents": [-1, 0, 0, 1, 3, -1]})
    return ScoreTreesRequest(references=[{"input_ids": long_ref, "trees": chains},
                                         {"input_ids": short_ref, "trees": trees}],
                             block_size=SCORE_BLOCK, returns=["topk", "logprobs"], top_k=TOP_K)


@pytest.fixture(scope="module")
def scored(hybrid_server, hybrid_target: Path):
    """The request, its reply, every node as (reference, row, anchor row, path, single-sequence sequence) and
    the reply of the single-chain request that scores each node as its own sequence."""
    import json

    vocab = json.loads((hybrid_target / "config.json").read_text())["vocab_size"]
    req = _request(vocab)
    tensors, header = score(hybrid_server.url, req, admin_key=HYBRID_ADMIN_KEY)
    nodes, singles = [], []
    for i, ref in enumerate(req.references):
        base = len(ref.trees)
        for j, tree in enumerate(ref.trees):
            toks, pars = tree.flat()
            for n, path in enumerate(node_paths(toks, pars)):
                nodes.append((i, base + n, j, path, ref.input_ids[: tree.anchor + 1]))
                singles.append({"input_ids": ref.input_ids[: tree.anchor + 1],
                                "trees": [{"anchor": tree.anchor, "branches": [path]}]})
            base += len(toks)
    single_req = ScoreTreesRequest(references=singles, block_size=SCORE_BLOCK, returns=["topk", "logprobs"],
                                   top_k=TOP_K)
    return req, tensors, header, nodes, score(hybrid_server.url, single_req, admin_key=HYBRID_ADMIN_KEY)[0]


def test_nodes_equal_their_own_sequence(scored) -> None:
    req, tensors, header, nodes, single = scored
    assert [r["prefix_cache"] for r in header["references"]] == ["off", "off"]  # no prefix cache on hybrid targets
    worst = 0.0
    for r, (i, row, anchor_row, path, _) in enumerate(nodes):
        got, want = tensors[f"ref{i}.logprobs"][row], single[f"ref{r}.logprobs"][len(path)]
        worst = max(worst, float((got - want).abs().max()))
        got_a, want_a = tensors[f"ref{i}.logprobs"][anchor_row], single[f"ref{r}.logprobs"][0]
        worst = max(worst, float((got_a - want_a).abs().max()))
        assert abs(float(tensors[f"ref{i}.lse"][row] - single[f"ref{r}.lse"][len(path)])) < 1e-3
    print(f"hybrid GDN score_trees: {len(nodes)} nodes, max abs log-prob difference vs each node as its own "
          f"sequence {worst:.2e}")
    assert len(nodes) >= 40 and worst < TOL


def test_nodes_equal_sglang_generate_logprobs(hybrid_server, scored) -> None:
    """A few nodes (both sides of the 64-token chunk boundary, the deepest tree node) vs SGLang's own prefill of
    prefix[:anchor+1] + path: its GDN backend and mamba state pool, not the replay."""
    _, tensors, _, nodes, _ = scored
    deepest = max(range(len(nodes)), key=lambda n: len(nodes[n][3]))
    worst = 0.0
    for n in sorted({0, 5, 12, deepest, len(nodes) - 1}):
        i, row, _, path, prefix = nodes[n]
        r = httpx.post(hybrid_server.url + "/generate", json={
            "input_ids": prefix + path, "return_logprob": True, "logprob_start_len": len(prefix) + len(path) - 1,
            "top_logprobs_num": 5, "sampling_params": {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}},
            timeout=120)
        assert r.status_code == 200, r.text[:500]
        for lp, tok, _ in r.json()["meta_info"]["output_top_logprobs"][0]:
            worst = max(worst, abs(lp - tensors[f"ref{i}.logprobs"][row][tok].item()))
    print(f"hybrid GDN score_trees vs SGLang /generate top-5 log-probs: max abs difference {worst:.2e}")
    assert worst < TOL


def test_features_equal_transformers_hidden_states(hybrid_server, hybrid_target: Path) -> None:
    from transformers import AutoModelForCausalLM

    ids = list(range(100, 140))
    bodies = [{"references": [{"input_ids": ids, "trees": trees}], "block_size": BLOCK_SIZE,
               "feature_layer_ids": FEATURE_LAYERS, "returns": ["hidden"]}
              for trees in ([{"anchor": 3, "branches": [[5, 6, 7]]}],
                            [{"anchor": 30, "tokens": [9, 8, 7], "parents": [-1, 0, 0]}])]
    feats = [score(hybrid_server.url, body, admin_key=HYBRID_ADMIN_KEY)[0]["ref0.features"] for body in bodies]
    assert torch.equal(feats[0], feats[1])  # the context does not depend on the trees
    model = AutoModelForCausalLM.from_pretrained(hybrid_target, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    width = hidden[0].shape[-1]
    for j, layer in enumerate(FEATURE_LAYERS):  # feature of layer l = the input of layer l + 1
        assert (feats[0][:, j * width:(j + 1) * width] - hidden[layer + 1][0]).abs().max() < TOL, layer


BAD_TREES = {
    "deeper than the block": ({"anchor": 0, "tokens": [5, 6, 7, 8], "parents": [-1, 0, 1, 2]},
                              ["longer than block_size - 1"]),
    "branch longer than the block": ({"anchor": 0, "branches": [[5, 6, 7, 8]]}, ["block_size - 1"]),
    "parent forward reference": ({"anchor": 0, "tokens": [5, 6, 7], "parents": [-1, 2, 0]}, ["forward reference"]),
    "parent cycle": ({"anchor": 0, "tokens": [5, 6], "parents": [-1, 1]}, ["cycle"]),
    "parent out of range": ({"anchor": 0, "tokens": [5, 6], "parents": [-1, -4]}, ["out of range"]),
    "parents of another length": ({"anchor": 0, "tokens": [5, 6], "parents": [-1]}, ["parents"]),
}


def test_bad_trees_are_400_and_the_server_keeps_serving(hybrid_server) -> None:
    for name, (tree, needles) in BAD_TREES.items():
        r = post_score(hybrid_server.url, {"references": [{"input_ids": [5, 6, 7, 8], "trees": [tree]}],
                                           "block_size": BLOCK_SIZE})
        assert r.status_code == 400, (name, r.status_code, r.text[:300])
        assert_4xx(r, *needles)
    assert httpx.get(hybrid_server.url + "/health_generate", timeout=120).status_code == 200
    score(hybrid_server.url, {"references": [{"input_ids": [5, 6, 7, 8],
                                              "trees": [{"anchor": 2, "branches": [[9, 10]]}]}],
                              "block_size": BLOCK_SIZE})
    # scoring neither read nor wrote the serving state: greedy output is what it was before any scoring
    assert _greedy(hybrid_server.url) == hybrid_server.extra["score_greedy"]
