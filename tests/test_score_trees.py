"""``POST /specopd/score_trees`` on a real SGLang server (tiny fp32 target, SPECOPD with a block-4 drafter).

Exactness: every node's scores (top-k and full log-probs) equal those of scoring ``prefix[:anchor+1] + the
node's root-to-node path`` as its own sequence -- checked against the same endpoint on single chains and
against SGLang's own ``/generate`` log-probs. Context features do not depend on the trees. The binary request
form equals the JSON one. Bad input gets a 4xx with a reason (also under a hypothesis fuzz) and the server
keeps serving.

The server is conftest's shared ``tiny_admin_server``, used by ``test_hot_swap.py`` and other modules too (see
:func:`shared_server`).
"""

from __future__ import annotations

import json
import os
import random
from typing import List

import httpx
import pytest
import torch

from support.score_trees import (  # noqa: F401  (shared_server: the module-scoped fixture)
    ADMIN_KEY,
    MAX_PAYLOAD,
    NEW_TOKENS,
    PREFIX_CACHE_MB,
    PROMPTS,
    Shared,
    assert_4xx,
    node_paths,
    post_score,
    random_tree,
    score,
    shared_server,
)
from sglang_specopd.wire.protocol import (
    ADMIN_KEY_HEADER,
    BINARY_CONTENT_TYPE,
    SCORE_TREES_PATH,
    ScoreTreesRequest,
    decode_tensors,
    encode_tensors,
    request_to_binary,
)

TOL = 1e-4  # fp32

# ---------------------------------------------------------------------------------------------------------------
# The shared server (conftest's tiny_admin_server, as test_score_trees.py and test_hot_swap.py see it)
# ---------------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------

pytestmark = pytest.mark.server


def prompt_token_ids(shared: "Shared", text: str) -> List[int]:
    """The prompt's token ids as SGLang tokenizes them (from its input_token_logprobs)."""
    r = httpx.post(shared.url + "/generate", json={
        "text": text, "return_logprob": True, "logprob_start_len": 0,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}}, timeout=60)
    assert r.status_code == 200, r.text[:300]
    meta = r.json()["meta_info"]
    ids = [e[1] for e in meta["input_token_logprobs"]]
    assert len(ids) == meta["prompt_tokens"]
    return ids


def target_greedy_ids(url: str, prompt_ids: List[int], output_ids: List[int]) -> List[int]:
    """The target's own greedy next token after ``prompt_ids + output_ids[:j]``, for every j (anchor rows)."""
    seq = prompt_ids + output_ids
    anchors = list(range(len(prompt_ids) - 1, len(seq) - 1))
    req = ScoreTreesRequest(references=[{"input_ids": seq, "trees": [{"anchor": a, "branches": [[seq[a]]]}
                                                                     for a in anchors]}],
                            block_size=2, top_k=2)
    tensors, _ = score(url, req)
    top = tensors["ref0.topk_logprobs"][: len(anchors)]
    assert (top[:, 0] - top[:, 1] > 1e-5).all(), "near-tie in the greedy choice: pick other prompts"
    return tensors["ref0.topk_ids"][: len(anchors), 0].tolist()


# ---------------------------------------------------------------------------------------------------------------
# Exactness
# ---------------------------------------------------------------------------------------------------------------

TOP_K = 8


def _exactness_request(shared: Shared, seed: int = 0):
    rng = random.Random(seed)
    V = shared.vocab_size
    prefix_a = [rng.randrange(5, V) for _ in range(12)]
    prefix_b = [rng.randrange(5, V) for _ in range(9)]
    chains = []
    for a in (0, 4, 7, 11):
        chains.append({"anchor": a, "branches": [[rng.randrange(5, V) for _ in range(rng.randint(1, 3))]
                                                 for _ in range(rng.randint(1, 3))]})
    trees = []
    for a in (1, 5, 8):
        toks, pars = random_tree(rng, V, rng.randint(3, 6), max_depth=4)
        trees.append({"anchor": a, "tokens": toks, "parents": pars})
    # A fixed tree that surely has siblings and depth 4, on top of the random ones.
    trees.append({"anchor": 3, "tokens": [10, 11, 12, 13, 14, 15], "parents": [-1, 0, 0, 1, 3, -1]})
    assert any(any(p >= 0 for p in t["parents"]) for t in trees)
    return ScoreTreesRequest(references=[{"input_ids": prefix_a, "trees": chains},
                                         {"input_ids": prefix_b, "trees": trees}],
                             block_size=5, returns=["topk", "logprobs"], top_k=TOP_K)


def _nodes(req: ScoreTreesRequest):
    """Per reference: (anchor, path, node indices along the path) for every scored node, in request order."""
    out = []
    for ref in req.references:
        rows = []
        for tree in ref.trees:
            toks, pars = tree.flat()
            base = len(rows)
            for n, path in enumerate(node_paths(toks, pars)):
                chain, k = [], n
                while k != -1:
                    chain.append(base + k)
                    k = pars[k]
                rows.append((tree.anchor, path, chain[::-1]))
        out.append(rows)
    return out


@pytest.fixture(scope="module")
def exactness(shared_server: Shared):
    """The random-tree request, its reply, and the reply of the single-chain reference request."""
    req = _exactness_request(shared_server)
    tensors, header = score(shared_server.url, req)
    nodes = _nodes(req)
    # Reference: every node as its own sequence -- prefix[:anchor+1], one anchor, one branch equal to its path.
    singles = []
    for ref, rows in zip(req.references, nodes):
        singles += [{"input_ids": ref.input_ids[: a + 1], "trees": [{"anchor": a, "branches": [path]}]}
                    for a, path, _ in rows]
    ref_req = ScoreTreesRequest(references=singles, block_size=req.block_size, returns=["topk", "logprobs"],
                                top_k=TOP_K)
    ref_tensors, _ = score(shared_server.url, ref_req)
    return req, tensors, header, nodes, ref_tensors


def test_reply_layout(shared_server: Shared, exactness) -> None:
    req, tensors, header, nodes, _ = exactness
    V = shared_server.vocab_size
    for i, ref in enumerate(req.references):
        A, N = len(ref.trees), len(nodes[i])
        assert header["references"][i] == {"num_anchors": A, "num_nodes": N, "prefix_len": len(ref.input_ids),
                                           "prefix_cache": "miss"}  # first call for this reference
        p = f"ref{i}."
        assert tensors[p + "topk_ids"].shape == (A + N, TOP_K) and tensors[p + "topk_ids"].dtype == torch.int64
        assert tensors[p + "topk_logprobs"].shape == (A + N, TOP_K)
        assert tensors[p + "topk_logprobs"].dtype == torch.float32
        assert tensors[p + "lse"].shape == (A + N,)
        assert tensors[p + "logprobs"].shape == (A + N, V)
        assert "hidden" not in {k[len(p):] for k in tensors if k.startswith(p)}
        owner = [j for j, t in enumerate(ref.trees) for _ in range(len(t.flat()[0]))]
        anchors = [ref.trees[j].anchor for j in owner]
        assert tensors[p + "node_anchor"].tolist() == anchors
        lp = tensors[p + "logprobs"]
        assert torch.allclose(lp.exp().sum(-1), torch.ones(A + N), atol=1e-4)
        # top-k are the k largest of the full row, in descending order
        vals, idx = lp.topk(TOP_K, dim=-1)
        assert torch.allclose(vals, tensors[p + "topk_logprobs"], atol=1e-6)
        assert torch.equal(lp.gather(1, tensors[p + "topk_ids"]), tensors[p + "topk_logprobs"])


def test_nodes_equal_their_own_sequence(exactness) -> None:
    """Every anchor row and node row == the same endpoint on prefix[:anchor+1] + path as a single chain."""
    req, tensors, _, nodes, ref_tensors = exactness
    r = 0  # reference index in the single-chain request
    checked = 0
    for i, ref in enumerate(req.references):
        A = len(ref.trees)
        p = f"ref{i}."
        anchor_row = {t.anchor: j for j, t in enumerate(ref.trees)}
        for n, (a, path, _) in enumerate(nodes[i]):
            q = f"ref{r}."
            # single chain: row 0 = its anchor, then the path's nodes; the node is the last row
            assert ref_tensors[q + "logprobs"].shape[0] == 1 + len(path)
            got = tensors[p + "logprobs"][A + n]
            want = ref_tensors[q + "logprobs"][len(path)]
            assert (got - want).abs().max() < TOL, (i, n, a, path, float((got - want).abs().max()))
            got_top = tensors[p + "topk_logprobs"][A + n]
            assert (got_top - ref_tensors[q + "topk_logprobs"][len(path)]).abs().max() < TOL
            # the ids agree except where neighbouring values are tied within tolerance
            gap = (got_top[:-1] - got_top[1:]).abs()
            ids, want_ids = tensors[p + "topk_ids"][A + n], ref_tensors[q + "topk_ids"][len(path)]
            for k in range(TOP_K):
                if (k == 0 or gap[k - 1] > TOL) and (k == TOP_K - 1 or gap[k] > TOL):
                    assert ids[k] == want_ids[k], (i, n, k)
            assert abs(tensors[p + "lse"][A + n] - ref_tensors[q + "lse"][len(path)]) < 1e-3
            # the anchor row equals the single chain's anchor row
            got_a = tensors[p + "logprobs"][anchor_row[a]]
            assert (got_a - ref_tensors[q + "logprobs"][0]).abs().max() < TOL
            r += 1
            checked += 1
    assert checked == sum(len(x) for x in nodes) >= 25


def _generate_logprobs(url: str, input_ids: List[int], start: int, k: int) -> dict:
    r = httpx.post(url + "/generate", json={
        "input_ids": input_ids, "return_logprob": True, "logprob_start_len": start, "top_logprobs_num": k,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}}, timeout=120)
    assert r.status_code == 200, r.text[:500]
    return r.json()["meta_info"]


def _check_top(entry, full_row: torch.Tensor, k: int, what) -> None:
    assert entry is not None and len(entry) == k, (what, entry)
    for lp, tok, _ in entry:
        assert abs(full_row[tok].item() - lp) < TOL, (what, tok, lp, full_row[tok].item())
    vals = [e[0] for e in entry]
    assert max(abs(a - b.item()) for a, b in zip(vals, full_row.topk(k).values)) < TOL, what


def test_nodes_equal_sglang_generate_logprobs(shared_server: Shared, exactness) -> None:
    """The deepest node of a few trees vs SGLang's own prefill log-probs of prefix[:anchor+1] + path.

    input_top_logprobs with logprob_start_len = s: entry 0 is None, entry j > 0 is the distribution of
    position s+j (computed at row s+j-1); the distribution after the last input token is output_top_logprobs[0].
    """
    req, tensors, _, nodes, _ = exactness
    k = 5
    for i, ref in enumerate(req.references):
        A = len(ref.trees)
        lp = tensors[f"ref{i}.logprobs"]
        anchor_row = {t.anchor: j for j, t in enumerate(ref.trees)}
        # the node with the longest path, and the last node
        picks = {max(range(len(nodes[i])), key=lambda n: len(nodes[i][n][1])), len(nodes[i]) - 1}
        for n in sorted(picks):
            a, path, chain = nodes[i][n]
            # rows of the packed reply along this path: the anchor, then the path's nodes
            path_rows = [anchor_row[a]] + [A + m for m in chain]
            assert len(path_rows) == len(path) + 1
            s = max(a - 1, 0)
            meta = _generate_logprobs(shared_server.url, ref.input_ids[: a + 1] + path, s, k)
            inp, out = meta["input_top_logprobs"], meta["output_top_logprobs"]
            assert inp[0] is None
            assert len(inp) == a + 1 + len(path) - s
            # entry j: distribution of position s+j, computed at row s+j-1 -> the anchor row is j = a+1-s
            for m, row in enumerate(path_rows[:-1]):
                _check_top(inp[a + 1 - s + m], lp[row], k, (i, n, m))
            _check_top(out[0], lp[path_rows[-1]], k, (i, n, "last"))
            # input_token_logprobs: the log-prob of each actual path token
            toks = meta["input_token_logprobs"]
            for m, row in enumerate(path_rows[:-1]):
                val, tok, _ = toks[a + 1 - s + m]
                assert tok == path[m] and abs(val - lp[row][tok].item()) < TOL


# ---------------------------------------------------------------------------------------------------------------
# Features, binary form, hidden states, client
# ---------------------------------------------------------------------------------------------------------------


def test_features_do_not_depend_on_trees(shared_server: Shared) -> None:
    from specopd_trainer.client.http import SpecOPDClient

    rng = random.Random(1)
    V, H = shared_server.vocab_size, shared_server.hidden_size
    ids = [rng.randrange(5, V) for _ in range(10)]
    layers = [0, shared_server.num_layers - 2]
    variants = [
        [],
        [{"anchor": 2, "branches": [[7, 8, 9], [10]]}, {"anchor": 9, "branches": [[11]]}],
        [{"anchor": 0, "tokens": [20, 21, 22, 23], "parents": [-1, 0, 0, 2]}, {"anchor": 5, "tokens": [30]}],
    ]
    feats = []
    for trees in variants:
        req = ScoreTreesRequest(references=[{"input_ids": ids, "trees": trees}], block_size=4, returns=["topk"],
                                feature_layer_ids=layers)
        tensors, _ = score(shared_server.url, req)
        assert tensors["ref0.features"].shape == (len(ids), len(layers) * H)
        assert tensors["ref0.features"].dtype == torch.float32
        feats.append(tensors["ref0.features"])
    for f in feats[1:]:
        assert (f - feats[0]).abs().max() < 1e-5
    with SpecOPDClient(shared_server.url, retries=0, admin_api_key=ADMIN_KEY) as client:
        ctx = client.context_features(ids, layers)
        assert ctx.shape == (len(ids), len(layers) * H) and (ctx - feats[0]).abs().max() < 1e-5
        # a single layer is the matching slice of the two-layer features
        one = client.context_features(ids, [layers[1]])
        assert (one - feats[0][:, H:]).abs().max() < 1e-5
        bf16 = client.context_features(ids, layers, dtype="bfloat16")
        assert bf16.dtype == torch.bfloat16 and (bf16.float() - feats[0]).abs().max() < 0.05
        # the features of a prefix are the first rows of the features of the whole sequence (causality)
        head = client.context_features(ids[:6], layers)
        assert (head - feats[0][:6]).abs().max() < 1e-5


def test_binary_request_equals_json(shared_server: Shared, exactness) -> None:
    req = exactness[0]
    req = req.model_copy(update={"returns": ["topk", "hidden", "logprobs"], "feature_layer_ids": [1]})
    a, ha = score(shared_server.url, req)
    b, hb = score(shared_server.url, req, binary=True)
    assert ha == hb and set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.allclose(a[k].float(), b[k].float(), atol=1e-6, rtol=0), k
    # The hidden states are the ones the log-probs come from: the trainer can apply the LM head itself.
    from safetensors.torch import load_file

    weights = load_file(str(shared_server.target / "model.safetensors"))
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    logits = a["ref0.hidden"] @ head.t()
    assert (torch.log_softmax(logits, -1) - a["ref0.logprobs"]).abs().max() < TOL


def test_client_score_trees(shared_server: Shared, exactness) -> None:
    from specopd_trainer.client.http import ServerRequestError, SpecOPDClient

    req = exactness[0]
    with SpecOPDClient(shared_server.url, retries=0, admin_api_key=ADMIN_KEY) as client:
        out = client.score_trees(req)
        assert len(out) == 2
        for i, sr in enumerate(out):
            assert torch.equal(sr.topk_ids, exactness[1][f"ref{i}.topk_ids"])
            assert sr.hidden is None and sr.features is None
            assert sr.num_anchors == len(req.references[i].trees) and sr.prefix_len == len(req.references[i].input_ids)
        bad = ScoreTreesRequest(references=[{"input_ids": [shared_server.vocab_size]}], block_size=4)
        with pytest.raises(ServerRequestError) as info:
            client.score_trees(bad)
        assert info.value.status == 400 and "vocabulary" in info.value.reason


def test_trie_packed_branches_equal_chain_branches(shared_server: Shared) -> None:
    """SpecOPD's trie packing (shared branch prefixes scored once) gives every branch the rows of its chain form."""
    from specopd_trainer.loops.branch_tree import pack_branches
    from specopd_trainer.client.http import SpecOPDClient

    gen = torch.Generator().manual_seed(0)
    n_anchors, k, g = 3, 6, 3  # block_size 4: 3 drafted slots, the first 2 tokens of a branch are scored
    prefix = torch.randint(5, shared_server.vocab_size, (24,), generator=gen).tolist()
    anchors = [3, 11, 23]
    branches = torch.randint(5, 8, (n_anchors, k, g), generator=gen)  # 3 token values: many shared prefixes
    packed = pack_branches(branches, g - 1)
    assert packed.num_nodes < n_anchors * k * (g - 1)
    chain = ScoreTreesRequest(references=[{"input_ids": prefix, "trees": [
        {"anchor": a, "branches": branches[j, :, : g - 1].tolist()} for j, a in enumerate(anchors)]}],
        block_size=4, returns=["hidden"])
    trie = ScoreTreesRequest(references=[{"input_ids": prefix, "trees": [
        {"anchor": a, "tokens": packed.tokens[j], "parents": packed.parents[j]} for j, a in enumerate(anchors)]}],
        block_size=4, returns=["hidden"])
    with SpecOPDClient(shared_server.url, retries=0, admin_api_key=ADMIN_KEY) as client:
        h_chain = client.score_trees(chain)[0].hidden
        h_trie = client.score_trees(trie)[0].hidden
    assert h_trie.shape[0] == n_anchors + packed.num_nodes
    chain_rows = torch.cat([h_chain[:n_anchors].repeat_interleave(k, 0)[:, None],
                            h_chain[n_anchors:].view(n_anchors * k, g - 1, -1)], dim=1)  # [A*K, G, H]
    torch.testing.assert_close(h_trie[packed.row_index], chain_rows, atol=TOL, rtol=TOL)


def test_root_only_trees_return_their_anchor_rows(shared_server: Shared) -> None:
    """Trees without nodes (SpecOPD root anchors) return exactly the anchor rows a tree with nodes gets, alone or
    mixed with trees that have nodes; rows stay [all anchor rows | nodes in tree order]."""
    from specopd_trainer.client.http import SpecOPDClient

    gen = torch.Generator().manual_seed(1)
    prefix = torch.randint(5, shared_server.vocab_size, (20,), generator=gen).tolist()
    full = ScoreTreesRequest(references=[{"input_ids": prefix, "trees": [
        {"anchor": a, "branches": [[7, 8]]} for a in (2, 9, 15)]}], block_size=4, returns=["hidden"])
    mixed = ScoreTreesRequest(references=[{"input_ids": prefix, "trees": [
        {"anchor": 2, "branches": [[7, 8]]}, {"anchor": 9, "tokens": []}, {"anchor": 15, "tokens": []}]}],
        block_size=4, returns=["hidden"])
    roots = ScoreTreesRequest(references=[{"input_ids": prefix, "trees": [
        {"anchor": a, "tokens": []} for a in (2, 9, 15)]}], block_size=4, returns=["hidden"])
    with SpecOPDClient(shared_server.url, retries=0, admin_api_key=ADMIN_KEY) as client:
        h_full = client.score_trees(full)[0].hidden  # [3 anchors + 6 nodes, H]
        h_mixed = client.score_trees(mixed)[0].hidden  # [3 anchors + 2 nodes, H]
        h_roots = client.score_trees(roots)[0].hidden  # [3 anchors, H]
    assert h_full.shape[0] == 9 and h_mixed.shape[0] == 5 and h_roots.shape[0] == 3
    torch.testing.assert_close(h_mixed[:3], h_full[:3], atol=TOL, rtol=TOL)
    torch.testing.assert_close(h_roots, h_full[:3], atol=TOL, rtol=TOL)
    torch.testing.assert_close(h_mixed[3:], h_full[3:5], atol=TOL, rtol=TOL)


def test_prefix_cache_hits_equal_full_forwards(shared_server: Shared) -> None:
    """A reference scored again reuses its prefix K/V ("hit": only the tree nodes run through the target) and
    gets the rows a full forward gives: the same trees again, other trees (against a full forward that bypasses
    the cache: a features request), root-only trees (no forward at all); a new prefix is a miss."""
    from specopd_trainer.client.http import SpecOPDClient

    rng = random.Random(7)
    V = shared_server.vocab_size
    prefix = [rng.randrange(5, V) for _ in range(23)]

    def trees(seed):
        r = random.Random(seed)
        out = []
        for a in (2, 9, 15, 22):
            toks, pars = random_tree(r, V, r.randint(2, 6), max_depth=3)
            out.append({"anchor": a, "tokens": toks, "parents": pars})
        return out

    def req(tr, **kw):
        return ScoreTreesRequest(references=[{"input_ids": prefix, "trees": tr}], block_size=4,
                                 returns=["hidden", "logprobs"], **kw)

    with SpecOPDClient(shared_server.url, retries=0, admin_api_key=ADMIN_KEY) as client:
        first = client.score_trees(req(trees(1)))[0]
        again = client.score_trees(req(trees(1)))[0]
        other = client.score_trees(req(trees(2)))[0]
        other_full = client.score_trees(req(trees(2), feature_layer_ids=[0]))[0]
        roots = client.score_trees(req([{"anchor": a, "tokens": []} for a in (2, 9, 15, 22)]))[0]
        fresh = client.score_trees(ScoreTreesRequest(references=[{"input_ids": prefix[:-1], "trees": trees(1)[:3]}],
                                                     block_size=4, returns=["hidden"]))[0]
    assert (first.prefix_cache, again.prefix_cache, other.prefix_cache) == ("miss", "hit", "hit")
    assert (other_full.prefix_cache, roots.prefix_cache, fresh.prefix_cache) == ("off", "hit", "miss")
    assert other_full.features is not None and other.features is None
    torch.testing.assert_close(again.hidden, first.hidden, atol=TOL, rtol=TOL)
    torch.testing.assert_close(again.logprobs, first.logprobs, atol=TOL, rtol=TOL)
    assert other.hidden.shape == other_full.hidden.shape and other.num_nodes == other_full.num_nodes > 4
    torch.testing.assert_close(other.hidden, other_full.hidden, atol=TOL, rtol=TOL)
    torch.testing.assert_close(other.logprobs, other_full.logprobs, atol=TOL, rtol=TOL)
    assert roots.hidden.shape[0] == 4
    torch.testing.assert_close(roots.hidden, first.hidden[:4], atol=TOL, rtol=TOL)
    # the different trees really score different rows (the comparison above is not between equal inputs)
    assert first.num_nodes != other.num_nodes or not torch.allclose(first.hidden[4:], other.hidden[4:])


# ---------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------


def _bad_requests(V: int):
    ok_ref = {"input_ids": [5, 6, 7, 8]}
    base = {"block_size": 4}
    return {
        "token outside vocab (node)": ({**base, "references": [{**ok_ref, "trees": [{"anchor": 1, "branches": [[V]]}]}]},
                                       ["outside the vocabulary"]),
        "token outside vocab (input)": ({**base, "references": [{"input_ids": [5, V + 7]}]}, ["outside the vocabulary"]),
        "negative token": ({**base, "references": [{**ok_ref, "trees": [{"anchor": 1, "tokens": [-3]}]}]},
                           ["outside the vocabulary"]),
        "branch longer than block": ({**base, "references": [{**ok_ref, "trees": [{"anchor": 0, "branches": [
            [5, 6], [5, 6, 7, 8]]}]}]}, ["block_size - 1 = 3"]),
        "tree path longer than block": ({**base, "references": [{**ok_ref, "trees": [{"anchor": 0, "tokens": [
            5, 6, 7, 8], "parents": [-1, 0, 1, 2]}]}]}, ["longer than block_size - 1"]),
        "anchor past the end": ({**base, "references": [{**ok_ref, "trees": [{"anchor": 4, "branches": [[5]]}]}]},
                                ["past the reference end"]),
        "parent forward reference": ({**base, "references": [{**ok_ref, "trees": [{"anchor": 0, "tokens": [5, 6, 7],
                                                                                  "parents": [-1, 2, 0]}]}]},
                                     ["forward reference"]),
        "parent cycle (self)": ({**base, "references": [{**ok_ref, "trees": [{"anchor": 0, "tokens": [5, 6],
                                                                             "parents": [-1, 1]}]}]}, ["cycle"]),
        "parent < -1": ({**base, "references": [{**ok_ref, "trees": [{"anchor": 0, "tokens": [5, 6],
                                                                    "parents": [-1, -5]}]}]}, ["out of range"]),
        "empty batch": ({**base, "references": []}, ["references"]),
        "unknown key": ({**base, "references": [ok_ref], "temperature": 1.0}, ["temperature"]),
        "last feature layer": ({**base, "references": [ok_ref], "feature_layer_ids": [3]}, ["feature layer id 3"]),
        "empty input_ids": ({**base, "references": [{"input_ids": []}]}, ["input_ids"]),
        "not json": ("{this is not json", ["invalid"]),
    }


@pytest.mark.parametrize("name", list(_bad_requests(1024)))
def test_bad_json_input_is_4xx(shared_server: Shared, name: str) -> None:
    body, needles = _bad_requests(shared_server.vocab_size)[name]
    if isinstance(body, str):
        r = httpx.post(shared_server.url + SCORE_TREES_PATH, content=body,
                       headers={"Content-Type": "application/json"}, timeout=60)
    else:
        r = post_score(shared_server.url, body)
    assert_4xx(r, *needles)


def test_payload_over_limit_is_413(shared_server: Shared) -> None:
    ids = [5] * (MAX_PAYLOAD // 2)  # "5, " per id: > the limit as JSON
    body = json.dumps({"references": [{"input_ids": ids}], "block_size": 4})
    assert len(body) > MAX_PAYLOAD
    r = httpx.post(shared_server.url + SCORE_TREES_PATH, content=body, headers={"Content-Type": "application/json"},
                   timeout=60)
    assert r.status_code == 413
    assert assert_4xx(r, "exceeds the limit", str(MAX_PAYLOAD))
    blob = encode_tensors({"ref0.input_ids": torch.zeros(MAX_PAYLOAD // 8 + 10, dtype=torch.int64)},
                          {"num_references": 1, "block_size": 4})
    r = httpx.post(shared_server.url + SCORE_TREES_PATH, content=blob, headers={"Content-Type": BINARY_CONTENT_TYPE},
                   timeout=60)
    assert r.status_code == 413


def test_reference_past_the_context_length_is_400(shared_server: Shared) -> None:
    """Positions beyond the target's context (prefix or a node) are refused, not an indexing error."""
    ctx = json.loads((shared_server.target / "config.json").read_text())["max_position_embeddings"]
    ok = {"input_ids": [5] * (ctx - 2), "trees": [{"anchor": ctx - 3, "branches": [[6, 7]]}]}  # last position ctx-1
    score(shared_server.url, {"references": [ok], "block_size": 4, "top_k": 1})
    too_deep = {"input_ids": [5] * (ctx - 1), "trees": [{"anchor": ctx - 2, "branches": [[6, 7]]}]}
    assert_4xx(post_score(shared_server.url, {"references": [too_deep], "block_size": 4}), "context")
    too_long = {"input_ids": [5] * (ctx + 3)}
    assert_4xx(post_score(shared_server.url, {"references": [too_long], "block_size": 4,
                                              "feature_layer_ids": [0]}), "context")


def test_hidden_and_features_need_the_admin_key(shared_server: Shared) -> None:
    """Issue 54: the target's hidden states and context features are admin-only (401 with the reason without the
    key, in the header or as the bearer on this server without --api-key); top-k needs no key."""
    ref = {"input_ids": [5, 6, 7, 8], "trees": [{"anchor": 1, "branches": [[9, 10]]}]}
    for extra in ({"returns": ["hidden"]}, {"feature_layer_ids": [0]}):
        req = {"references": [ref], "block_size": 4, **extra}
        r = post_score(shared_server.url, req, admin_key=None)
        assert r.status_code == 401, (r.status_code, r.text[:300])
        assert "admin key" in r.json()["error"]["message"] and ADMIN_KEY_HEADER in r.json()["error"]["message"]
        assert post_score(shared_server.url, req).status_code == 200
        r = httpx.post(shared_server.url + SCORE_TREES_PATH, content=json.dumps(req),
                       headers={"Content-Type": "application/json", **shared_server.admin_headers}, timeout=60)
        assert r.status_code == 200, r.text[:300]
    assert post_score(shared_server.url, {"references": [ref], "block_size": 4}, admin_key=None).status_code == 200


def _binary_parts(shared: Shared):
    req = ScoreTreesRequest(references=[{"input_ids": [5, 6, 7, 8], "trees": [{"anchor": 1, "branches": [[9, 10]]}]}],
                            block_size=4)
    return decode_tensors(request_to_binary(req))


def test_binary_wrong_dtype_is_400(shared_server: Shared) -> None:
    tensors, header = _binary_parts(shared_server)
    tensors["ref0.node_tokens"] = tensors["ref0.node_tokens"].to(torch.float32)
    r = httpx.post(shared_server.url + SCORE_TREES_PATH, content=encode_tensors(tensors, header),
                   headers={"Content-Type": BINARY_CONTENT_TYPE}, timeout=60)
    assert_4xx(r, "ref0.node_tokens", "float32")


@pytest.mark.parametrize("kind", ["truncated", "garbage", "empty", "bad header length", "missing tensor",
                                  "header not an object"])
def test_binary_malformed_is_400(shared_server: Shared, kind: str) -> None:
    from safetensors.torch import save

    tensors, header = _binary_parts(shared_server)
    good = encode_tensors(tensors, header)
    if kind == "truncated":
        body = good[: len(good) - 7]
    elif kind == "garbage":
        body = b"\x93NUMPY" + os.urandom(64)
    elif kind == "empty":
        body = b""
    elif kind == "bad header length":
        body = (2**40).to_bytes(8, "little") + good[8:]
    elif kind == "missing tensor":
        del tensors["ref0.anchors"]
        body = encode_tensors(tensors, header)
    else:
        body = save(tensors, metadata={"specopd": "[1, 2]"})
    r = httpx.post(shared_server.url + SCORE_TREES_PATH, content=body, headers={"Content-Type": BINARY_CONTENT_TYPE},
                   timeout=60)
    assert_4xx(r)


def test_server_keeps_serving_after_bad_input(shared_server: Shared) -> None:
    for p in PROMPTS[:1]:
        assert shared_server.srv.generate(p, NEW_TOKENS)["output_ids"] == shared_server.reference[p]
    score(shared_server.url, ScoreTreesRequest(references=[{"input_ids": [5, 6], "trees": [
        {"anchor": 1, "branches": [[7]]}]}], block_size=4))


def test_reference_outputs_are_the_target_greedy(shared_server: Shared) -> None:
    """The SPECOPD server's greedy outputs (the swap tests' reference) are the target's own greedy tokens."""
    for p in PROMPTS:
        prompt_ids = prompt_token_ids(shared_server, p)
        out = shared_server.reference[p]
        assert target_greedy_ids(shared_server.url, prompt_ids, out) == out


# ---------------------------------------------------------------------------------------------------------------
# Fuzz
# ---------------------------------------------------------------------------------------------------------------


def _fuzz_strategies(V: int):
    from hypothesis import strategies as st
    from safetensors.torch import save

    ints = st.one_of(st.integers(-3, V + 3), st.sampled_from([-2**63, 2**63 - 1, 2**64, 10**30]))
    small = st.integers(-2, 12)
    tree = st.one_of(
        st.fixed_dictionaries({"anchor": small, "branches": st.lists(st.lists(ints, max_size=5), max_size=3)}),
        st.fixed_dictionaries({"anchor": small, "tokens": st.lists(ints, max_size=6)},
                              optional={"parents": st.lists(st.integers(-3, 7), max_size=6)}),
        st.dictionaries(st.sampled_from(["anchor", "branches", "tokens", "parents", "junk"]),
                        st.one_of(small, st.lists(small, max_size=3), st.text(max_size=3)), max_size=4),
    )
    ref = st.fixed_dictionaries({"input_ids": st.lists(ints, max_size=10)},
                                optional={"trees": st.lists(tree, max_size=3), "extra": st.just(1)})
    request = st.fixed_dictionaries(
        {"references": st.lists(ref, max_size=3)},
        optional={"block_size": st.integers(-1, 70), "returns": st.lists(st.sampled_from(
                      ["topk", "hidden", "logprobs", "junk"]), max_size=3),
                  "top_k": st.integers(-1, 1100), "feature_layer_ids": st.lists(st.integers(-2, 5), max_size=3),
                  "output_dtype": st.sampled_from(["float32", "bfloat16", "int8"]), "junk": st.none()})
    json_value = st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)),
        lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=8), c, max_size=4)),
        max_leaves=15)

    json_body = st.one_of(request.map(json.dumps), json_value.map(json.dumps), st.binary(max_size=200),
                          request.map(lambda r: json.dumps(r)[: len(json.dumps(r)) // 2]))

    names = st.sampled_from(["ref0.input_ids", "ref0.anchors", "ref0.node_tokens", "ref0.node_parents",
                             "ref0.node_anchor", "ref1.input_ids", "junk"])
    dtypes = st.sampled_from([torch.int64, torch.int32, torch.float32, torch.uint8, torch.bool, torch.bfloat16])

    @st.composite
    def tensor(draw):
        dtype = draw(dtypes)
        shape = draw(st.sampled_from([(0,), (1,), (3,), (2, 2)]))
        vals = draw(st.lists(st.integers(-3, 12), min_size=4, max_size=4))
        t = torch.tensor(vals, dtype=torch.int64)[: int(torch.tensor(shape).prod())].reshape(shape)
        return t.to(dtype) if dtype != torch.bool else t > 0

    header = st.one_of(
        st.fixed_dictionaries({"num_references": st.one_of(st.integers(-1, 3), st.text(max_size=2), st.none())},
                              optional={"block_size": st.integers(0, 8), "top_k": st.integers(0, 5),
                                        "returns": st.just(["topk"]), "junk": st.none()}),
        json_value)

    @st.composite
    def mutated_valid(draw):
        req = ScoreTreesRequest(references=[{"input_ids": [5, 6, 7], "trees": [{"anchor": 1, "branches": [[8, 9]]}]}],
                                block_size=4)
        data = bytearray(request_to_binary(req))
        for _ in range(draw(st.integers(1, 4))):
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] = draw(st.integers(0, 255))
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
        return bytes(data)

    binary_body = st.one_of(
        st.builds(lambda ts, h: encode_tensors(ts, h) if isinstance(h, dict) else save(
            {k: v.contiguous() for k, v in ts.items()}, metadata={"specopd": json.dumps(h)}),
                  st.dictionaries(names, tensor(), min_size=1, max_size=6), header),
        mutated_valid(),
        st.binary(max_size=300),
    )
    return st.one_of(st.tuples(st.just("application/json"), json_body),
                     st.tuples(st.just(BINARY_CONTENT_TYPE), binary_body))


def test_fuzz_score_trees(shared_server: Shared) -> None:
    from hypothesis import HealthCheck, given, settings

    url = shared_server.url
    seen = {"ok": 0, "4xx": 0}

    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(_fuzz_strategies(shared_server.vocab_size))
    def check(case):
        ctype, body = case
        r = httpx.post(url + SCORE_TREES_PATH, content=body, headers={"Content-Type": ctype}, timeout=120)
        assert r.status_code < 500, (r.status_code, r.text[:300], body[:300])
        if r.status_code == 200:
            tensors, header = decode_tensors(r.content)
            assert len(header["references"]) >= 1
            for i, meta in enumerate(header["references"]):
                assert tensors[f"ref{i}.node_anchor"].shape == (meta["num_nodes"],)
            seen["ok"] += 1
        else:
            assert r.json()["error"]["message"]
            seen["4xx"] += 1

    check()
    assert seen["4xx"] > 0
    # still serving, and the same greedy tokens as before the fuzzing
    for p in PROMPTS[:2]:
        assert shared_server.srv.generate(p, NEW_TOKENS)["output_ids"] == shared_server.reference[p]


def test_prefix_cache_stats_and_admin_clear(shared_server: Shared) -> None:
    """GET /specopd/prefix_cache counts hits and misses; clearing needs the admin key and empties the cache."""
    from specopd_trainer.client.http import ServerRequestError, SpecOPDClient

    req = ScoreTreesRequest(references=[{"input_ids": list(range(30, 48)), "trees": [{"anchor": 3, "tokens": []}]}],
                            block_size=4, returns=["hidden"])
    with SpecOPDClient(shared_server.url, retries=0, admin_api_key=ADMIN_KEY) as client, \
            SpecOPDClient(shared_server.url, retries=0, admin_api_key=ADMIN_KEY) as admin:
        before = client.prefix_cache()
        client.score_trees(req)
        client.score_trees(req)
        mid = client.prefix_cache()
        assert (mid["hits"] - before["hits"], mid["misses"] - before["misses"]) == (1, 1)
        assert mid["entries"] >= 1 and 0 < mid["bytes"] <= mid["budget_bytes"] == PREFIX_CACHE_MB * 2**20
        with pytest.raises(ServerRequestError) as exc:
            client.prefix_cache(clear=True)  # no admin key
        assert exc.value.status in (401, 403)
        cleared = admin.prefix_cache(clear=True)
        assert cleared["entries"] == 0 and cleared["bytes"] == 0
        assert client.score_trees(req)[0].prefix_cache == "miss"


def test_prefix_cache_is_cleared_when_the_target_weights_change(shared_server: Shared) -> None:
    """SGLang's own weight update (here: the same target from disk) empties the cache: the next call recomputes.
    Last in the module: it reloads the served target."""
    from specopd_trainer.client.http import SpecOPDClient

    prefix = list(range(5, 25))
    req = ScoreTreesRequest(references=[{"input_ids": prefix, "trees": [{"anchor": 4, "branches": [[7, 8]]}]}],
                            block_size=4, returns=["hidden"])
    with SpecOPDClient(shared_server.url, retries=0, admin_api_key=ADMIN_KEY) as client:
        before = client.score_trees(req)[0]
        assert client.score_trees(req)[0].prefix_cache == "hit"
        r = httpx.post(shared_server.url + "/update_weights_from_disk", json={"model_path": str(shared_server.target)},
                       headers=shared_server.admin_headers, timeout=300)
        assert r.status_code == 200 and r.json()["success"], r.text[:500]
        after = client.score_trees(req)[0]
    assert after.prefix_cache == "miss"
    torch.testing.assert_close(after.hidden, before.hidden, atol=TOL, rtol=TOL)
