"""A real SGLang CPU server on the tiny QSA-GDN target (Qwen4-Exp architecture: Gated DeltaNet + sparse attention
with a QSA indexer; issue 23 part 2).

The target is ``tiny-qwen4exp-sparse`` (:mod:`sglang_specopd.app.tiny.qsa`: 8 layers, three GDN layers per QSA
attention layer, QSA budget 32 in blocks of 4, so a query that sees more than 32 tokens attends to a selection),
served plainly in fp32 through the plugin's CPU adaptations (the Qwen3.5 stand-in ops, adaptation 13:
:mod:`sglang_specopd.server.cpu.qwen4_exp`). For prompts in the dense regime (<= 32 tokens) and in the sparse one,
prefill and decode included, the server's greedy ids must equal transformers' own greedy generation, and its
prompt log-probs transformers' within 1e-4. SGLang scores the indexer on a bf16 query and bf16 compressed keys
even on an fp32 server; the reference does the same (:func:`sglang_specopd.app.tiny.qsa.served_index_precision`).
Scored in fp32 instead, 'sparse-90' selects another block at one query of layer 3 (its 8th and 9th best blocks are
0.23% apart) and its continuation differs from the fourth token on.
``/specopd/score_trees`` scores proposal trees on it (issue 23 part 3: per-node QSA selection,
:mod:`sglang_specopd.server.scoring.qsa`): every node's log-probs equal SGLang's own prefill of that node's branch.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Dict, List

import httpx
import pytest

from conftest import running_server
from support.qsa_server import EXTRA_ARGS, QSA_ADMIN_KEY, qsa_specopd_server  # noqa: F401  (a shared fixture)

pytestmark = pytest.mark.server

NEW_TOKENS = 16


def _prompts() -> Dict[str, List[int]]:
    rng = random.Random(23)
    return {"dense-20": [rng.randrange(5, 49152) for _ in range(20)],
            "sparse-45": [rng.randrange(5, 49152) for _ in range(45)],
            "sparse-90": [rng.randrange(5, 49152) for _ in range(90)]}


@pytest.fixture(scope="module")
def hf_reference(qsa_target: Path) -> Dict[str, dict]:
    """transformers (fp32, eager, the indexer's query and block keys rounded to bf16 as SGLang serves them): each
    prompt's greedy continuation and its prompt log-probs."""
    import torch

    from sglang_specopd.app.tiny.qsa import load_tiny_qwen4exp, served_index_precision

    model = load_tiny_qwen4exp(qsa_target)
    out = {}
    for name, ids in _prompts().items():
        with torch.no_grad(), served_index_precision():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            cur = list(ids)
            for _ in range(NEW_TOKENS):
                cur.append(int(model(torch.tensor([cur])).logits[0, -1].argmax()))
        out[name] = {"ids": cur[len(ids):], "prompt_logprobs": [lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]}
    return out


@pytest.fixture(scope="module")
def qsa_server(qsa_target: Path, tmp_path_factory: pytest.TempPathFactory):
    """The plain server on the sparse QSA target (fp32, no radix cache)."""
    from sglang_specopd.app.launch.process import LaunchSpec, free_port

    spec = LaunchSpec(model_path=str(qsa_target), port=free_port(), device="cpu", dtype="float32",
                      attention_backend="torch_native", max_total_tokens=2048, disable_cuda_graph=True,
                      disable_overlap_schedule=True, sleep_on_idle=True, extra_args=list(EXTRA_ARGS))
    with running_server(spec, tmp_path_factory.mktemp("logs"), "qsa-plain") as srv:
        yield srv


def _generate(srv, ids: List[int], **extra) -> dict:
    r = httpx.post(srv.url + "/generate", json={
        "input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}, **extra},
        timeout=600)
    assert r.status_code == 200, f"/generate -> {r.status_code}: {r.text[:500]}"
    return r.json()


@pytest.fixture(scope="module")
def served(qsa_server) -> Dict[str, dict]:
    """The plain server's greedy responses (with prompt log-probs), before any tree is scored."""
    return {name: _generate(qsa_server, ids) for name, ids in _prompts().items()}


@pytest.mark.parametrize("name", list(_prompts()))
def test_plain_greedy_and_prompt_logprobs_equal_transformers_fp32(served, hf_reference, name) -> None:
    got, want = served[name], hf_reference[name]
    assert got["output_ids"] == want["ids"], (name, got["output_ids"], want["ids"])
    served_lp = [t[0] for t in got["meta_info"]["input_token_logprobs"][1:]]
    assert len(served_lp) == len(want["prompt_logprobs"])
    worst = max(abs(a - b) for a, b in zip(served_lp, want["prompt_logprobs"]))
    print(f"{name}: max abs prompt log-prob difference vs transformers {worst:.2e}")
    assert worst < 1e-4, (name, worst)


def _tree_request(prefix: List[int]):
    """Anchors below the budget (dense), just past it, and later (blocks completed inside the branches, some
    straddling the anchor); chains and trees with siblings, paths of up to 6 tokens."""
    from support.score_trees import random_tree
    from sglang_specopd.wire.protocol import ScoreTreesRequest

    rng = random.Random(5)
    trees = [{"anchor": a, "branches": [[rng.randrange(5, 49152) for _ in range(rng.randint(1, 6))]
                                        for _ in range(2)]} for a in (12, 33, 46)]
    trees += [{"anchor": a, "tokens": t, "parents": p}
              for a in (31, 34, 57) for t, p in [random_tree(rng, 49152, 7, max_depth=6)]]
    return ScoreTreesRequest(references=[{"input_ids": prefix, "trees": trees}], block_size=7,
                             returns=["logprobs"])


def test_score_trees_nodes_equal_sglang_prefill_of_each_branch(qsa_server, served) -> None:
    """Every node (and anchor row) of the trees vs SGLang's own prefill of prefix[:anchor+1] + the node's path
    (its QSA indexer, metadata and pool): the top-5 log-probs at every position of every root-to-leaf branch."""
    from support.score_trees import node_paths, score

    prefix = _prompts()["sparse-90"][:60]
    req = _tree_request(prefix)
    tensors, header = score(qsa_server.url, req, admin_key=QSA_ADMIN_KEY)
    head = header["references"][0]
    assert head["prefix_cache"] == "off"
    # what the QSA layers computed, per tree in packing order (anchors 12, 33, 46, 31, 34, 57): the anchor-12 tree's
    # nodes see at most 32 tokens (no top-k: one selection per depth, no margin), the others' nodes are scored
    counts, margins = head["qsa_selections_per_tree"], head["qsa_min_topk_margin_per_tree"]
    assert len(counts) == len(margins) == 6
    for tree, count, margin in zip(req.references[0].trees, counts, margins):
        _, pars = tree.flat()
        depth: List[int] = []
        for par in pars:
            depth.append(0 if par < 0 else depth[par] + 1)
        # a node at depth m is the query at position anchor + 1 + m; it is scored (top-k over its blocks) when it
        # sees more than block_topk = 8 complete blocks of 4, and then it is one selection of its own
        scored = [(tree.anchor + 2 + m) // 4 > 8 for m in depth]
        assert count == sum(scored) + len({m for m, s in zip(depth, scored) if not s}), (tree.anchor, count)
        assert (margin is None) == (not any(scored)) and (margin is None or margin >= 0), (tree.anchor, margin)
    lp = tensors["ref0.logprobs"]
    base, worst, checked, branches = len(req.references[0].trees), 0.0, set(), 0
    for j, tree in enumerate(req.references[0].trees):
        toks, pars = tree.flat()
        paths = node_paths(toks, pars)
        leaves = set(range(len(paths))) - {par for par in pars if par >= 0}
        for leaf in sorted(leaves):
            path = paths[leaf]
            # input entries from token `anchor` on (SGLang's first entry has no distribution), so entries 1.. are the
            # distributions of the anchor row and of every node but the leaf; the leaf's is the generated token's
            r = _generate(qsa_server, prefix[: tree.anchor + 1] + path, logprob_start_len=tree.anchor,
                          top_logprobs_num=5, sampling_params={"temperature": 0.0, "max_new_tokens": 1})
            tops = r["meta_info"]["input_top_logprobs"][1:] + r["meta_info"]["output_top_logprobs"][:1]
            rows = [j] + [base + node for node in _ancestors(pars, leaf)]
            assert len(tops) == len(rows), (len(tops), rows)
            for row, top in zip(rows, tops):
                for value, token, _ in top:
                    worst = max(worst, abs(value - lp[row][token].item()))
                checked.add(row)
            branches += 1
        base += len(toks)
    print(f"QSA score_trees: {len(checked)} rows over {branches} branches, max abs top-5 log-prob difference vs "
          f"SGLang's prefill of each branch {worst:.2e}")
    assert branches >= 10 and worst < 1e-4


def _ancestors(parents: List[int], node: int) -> List[int]:
    """Root-to-node packed indices within one tree."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def test_score_trees_greedy_after_scoring_unchanged(qsa_server, served) -> None:
    """Scoring trees neither reads nor writes the QSA pool / indexer rings: serving afterwards is unchanged."""
    again = _generate(qsa_server, _prompts()["sparse-90"])
    assert again["output_ids"] == served["sparse-90"]["output_ids"]


def test_score_trees_features_equal_transformers_mixed_attention_inputs(qsa_server, qsa_target: Path) -> None:
    """Qwen4-Exp's DFlash feature of layer l is the mixed attention input of layer l + 1
    (:mod:`sglang_specopd.server.qwen4_exp_features`): transformers' ``layers[l + 1].attn_hyper_connection`` output,
    into GDN layers (1 -> layer 2, 5 -> layer 6) and the sparse one (2 -> layer 3, QSA), 45 tokens (sparse regime)."""
    import torch

    from support.score_trees import score

    from sglang_specopd.app.tiny.qsa import load_tiny_qwen4exp, served_index_precision

    ids, layers = _prompts()["sparse-45"], [1, 2, 5]
    body = {"references": [{"input_ids": ids, "trees": [{"anchor": 40, "branches": [[7, 8]]}]}],
            "block_size": 4, "returns": ["hidden"], "feature_layer_ids": layers}
    feats = score(qsa_server.url, body, admin_key=QSA_ADMIN_KEY)[0]["ref0.features"]
    model = load_tiny_qwen4exp(qsa_target)
    seen = {}
    hooks = [model.model.layers[i + 1].attn_hyper_connection.register_forward_hook(
        lambda mod, args, out, i=i: seen.__setitem__(i, out[0][0])) for i in layers]
    try:
        with torch.no_grad(), served_index_precision():
            model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    width = model.config.hidden_size
    assert feats.shape == (len(ids), width * len(layers))
    for j, layer in enumerate(layers):
        diff = (feats[:, j * width:(j + 1) * width] - seen[layer]).abs().max().item()
        print(f"layer {layer}: feature max abs {seen[layer].abs().max().item():.3f}, difference {diff:.1e}")
        assert seen[layer].abs().max() > 0.1 and diff < 1e-4, (layer, diff)


@pytest.mark.parametrize("name", list(_prompts()))
def test_specopd_greedy_equals_plain_fp32(qsa_specopd_server, served, name) -> None:
    """Speculative decoding on the QSA-GDN target is lossless: greedy ids equal the plain server's, in the dense
    and the sparse regime. In the sparse regime this needs adaptation 14 (:mod:`sglang_specopd.server.cpu.qsa_ring`):
    with SGLang's one-group index-key ring, a verify window straddling a block end compressed the block from
    overwritten keys, and 'sparse-90' diverged at its third token."""
    r = httpx.post(qsa_specopd_server.url + "/generate", json={
        "input_ids": _prompts()[name],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}}, timeout=600)
    assert r.status_code == 200, r.text[:500]
    body = r.json()
    assert body["output_ids"] == served[name]["output_ids"]
    assert body["meta_info"]["spec_verify_ct"] >= NEW_TOKENS // 4, body["meta_info"]  # every token went through verify
