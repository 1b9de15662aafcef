"""QSA sparse attention kernels (specopd_kernels.sparse): a hand-checked selection, the tree reference against
sequential decoding of every branch, the vectorized tree selection and the torch / Triton attention against the
references on a grid (budgets, compress ratios, tree shapes, prefix lengths around the budget, GQA, fp32 / bf16),
and a hypothesis fuzz of the selection. Triton runs under the interpreter on CPU (the module fixture sets
TRITON_INTERPRET=1 before the kernel is built; on a CUDA machine the compiled kernel runs instead)."""

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _sparse_cases import make_sparse_case
from _tree_attention_cases import random_parents
from support.triton import triton_interpret  # noqa: F401  (module fixture: TRITON_INTERPRET=1 on CPU)
from specopd_kernels.sparse import (QSAConfig, get_sparse_attention, node_paths, qsa_logits, qsa_select_sequence_naive,
                                    qsa_sequence_naive, qsa_tree_attention, qsa_tree_naive, qsa_tree_select,
                                    sparse_attention_backend_name, sparse_attention_naive, sparse_attention_torch)
from specopd_kernels.sparse import triton_sparse as tri
from specopd_kernels.tree import build_tree_layout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------------------------------------ hand case

def _hand_sequence():
    """r = 2, budget 2 (one block), Hi = 1, Di = 2, no norm / RoPE, score scale 1. Block keys: b0 = mean(k0, k1) =
    (1, 0), b1 = mean(k2, k3) = (0, 2), b2 = mean(k4, k5) = (1, 1)."""
    cfg = QSAConfig(budget=2, compress_ratio=2, score_scale=1.0)
    ik = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 3.0], [2.0, 2.0], [0.0, 0.0]])
    iq = torch.tensor([[5.0, 5.0], [5.0, 5.0], [5.0, 5.0], [-1.0, -1.0], [1.0, -1.0], [1.0, 1.0]])[:, None, :]
    return cfg, iq, ik


def test_selection_hand_case():
    cfg, iq, ik = _hand_sequence()
    # p0: no complete block, tail {0}; p1: block 0 fits the budget; p2: block 0 + tail {2};
    # p3: logits (0, 0) (ReLU), tie -> block 0; its own block 1 is complete but not selected, no tail;
    # p4: logits (1, 0) -> block 0, tail {4}; p5: logits (1, 2, 2), tie b1 / b2 -> b1 (lower index), no tail
    want = torch.tensor([[0, -1, -1], [0, 1, -1], [0, 1, 2], [0, 1, -1], [0, 1, 4], [2, 3, -1]])
    assert torch.equal(qsa_select_sequence_naive(iq, ik, cfg), want)
    torch.testing.assert_close(qsa_logits(iq[5:], torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]), cfg),
                               torch.tensor([[1.0, 2.0, 2.0]]))
    sel = qsa_tree_select(iq, ik, ik[:0], build_tree_layout(6, [], []), cfg)  # the same row as prefix rows
    assert torch.equal(sel.positions, want) and torch.equal(sel.indices, want)
    assert sel.counts.tolist() == [1, 2, 3, 2, 3, 2] and sel.scored.tolist() == [False] * 3 + [True] * 3
    # attention of p5 over rows 2, 3 only: q . k = (0, 2) -> weights softmax(0, 2 / sqrt 2)
    q = torch.zeros(6, 1, 2)
    q[5, 0] = torch.tensor([1.0, 0.0])
    k = torch.zeros(6, 1, 2)
    k[3, 0, 0] = 2.0
    v = torch.arange(12.0).reshape(6, 1, 2)
    out, _ = qsa_sequence_naive(q, k, v, iq, ik, cfg)
    w = torch.softmax(torch.tensor([0.0, 2.0 / 2 ** 0.5]), 0)
    torch.testing.assert_close(out[5, 0], w[0] * v[2, 0] + w[1] * v[3, 0])
    torch.testing.assert_close(out[0, 0], v[0, 0])


# ------------------------------------------------------------------------------------------------ tree == branches

BRANCH_GRID = [  # (shape, prefix, ratio, block_topk)
    ("chain", 5, 2, 3), ("chain", 9, 4, 2), ("star", 6, 2, 3), ("star", 13, 3, 2), ("random", 8, 4, 2),
    ("random", 17, 2, 4),
]


@pytest.mark.parametrize("shape,p,ratio,kb", BRANCH_GRID)
def test_tree_reference_equals_each_branch_decoded_sequentially(shape, p, ratio, kb):
    """Every node's selection and output = those of the same token when its branch prefix[0..a] + path is decoded
    token by token; the prefix rows = the prefix decoded alone. Blocks straddle the anchor (prefixes not multiples of
    r), so a node's visible block keys mix prefix and ancestor keys."""
    c = make_sparse_case(shape, p, ratio, kb, hq=6, hkv=2, seed=p)
    out, pos, idx = qsa_tree_naive(c.q, c.k, c.v, c.iq, c.ik, c.layout, c.cfg)
    o_pre, pos_pre = qsa_sequence_naive(c.q[:p], c.k[:p], c.v[:p], c.iq[:p], c.ik[:p], c.cfg)
    assert torch.equal(pos[:p], pos_pre) and torch.equal(idx[:p], pos_pre)
    torch.testing.assert_close(out[:p], o_pre, atol=1e-6, rtol=1e-6)
    paths = node_paths(c.layout)
    leaves = set(range(len(paths))) - {j for _, path in paths for j in path[:-1]}
    seen = set()
    for leaf in sorted(leaves):
        a, path = paths[leaf]
        rows = list(range(a + 1)) + [p + j for j in path]
        o_b, pos_b = qsa_sequence_naive(*(x[rows] for x in (c.q, c.k, c.v, c.iq, c.ik)), c.cfg)
        for m, node in enumerate(path):
            assert torch.equal(pos[p + node], pos_b[a + 1 + m]), (leaf, node)
            torch.testing.assert_close(out[p + node], o_b[a + 1 + m], atol=1e-6, rtol=1e-6)
            seen.add(node)
    assert seen == set(range(c.layout.num_nodes))
    assert int((pos >= 0).sum(1).min()) >= 1 and int((pos >= 0).sum(1).max()) <= c.cfg.width


# ------------------------------------------------------------------------------------------------ vectorized grid

def _grid():
    """(shape, prefix, ratio, block_topk, hq, hkv, dtype): prefixes around the budget (budget - 1, budget,
    budget + r, 3 budget + 1), block_topk 1..4 (the top-k below and above the visible block count)."""
    gqa = [(4, 4), (4, 2), (6, 2), (8, 1)]
    out, i = [], 0
    for ratio, kb in ((2, 1), (2, 3), (3, 2), (4, 4)):
        budget = ratio * kb
        for shape in ("chain", "star", "random"):
            for p in (max(1, budget - 1), budget, budget + ratio, 3 * budget + 1)[i % 2::2]:
                hq, hkv = gqa[i % 4]
                out.append((shape, p, ratio, kb, hq, hkv, torch.bfloat16 if i % 3 == 2 else torch.float32))
                i += 1
    return out


@pytest.mark.parametrize("shape,p,ratio,kb,hq,hkv,dtype", _grid())
def test_tree_select_and_torch_attention_match_reference(shape, p, ratio, kb, hq, hkv, dtype):
    c = make_sparse_case(shape, p, ratio, kb, hq=hq, hkv=hkv, dtype=dtype, depth=5, seed=7 * p + kb)
    out, pos, idx = qsa_tree_naive(c.q, c.k, c.v, c.iq, c.ik, c.layout, c.cfg)
    sel = qsa_tree_select(c.iq, c.ik[:p], c.ik[p:], c.layout, c.cfg)
    assert torch.equal(sel.positions, pos) and torch.equal(sel.indices, idx)
    assert torch.equal(sel.counts, (pos >= 0).sum(1))
    nodes = qsa_tree_select(c.iq[p:], c.ik[:p], c.ik[p:], c.layout, c.cfg)  # node rows only
    assert torch.equal(nodes.indices, idx[p:]) and torch.equal(nodes.scored, sel.scored[p:])
    got = sparse_attention_torch(c.q, c.k, c.v, sel.indices)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), out.float(), **_tol(dtype))
    cached = sparse_attention_torch(c.q[p:], c.k[p:], c.v[p:], nodes.indices, prefix_kv=(c.k[:p], c.v[:p]))
    torch.testing.assert_close(cached.float(), out[p:].float(), **_tol(dtype))


def test_rows_that_fit_the_budget_share_one_selection():
    """Rows that see at most block_topk blocks take every block without scoring, so all nodes at one (anchor,
    depth) select the same positions; a duplicated branch (same anchor, same inputs) selects the same keys."""
    c = make_sparse_case("star", 5, 2, 4, seed=3)  # P = 5 < budget 8: every node of the star fits
    sel = qsa_tree_select(c.iq, c.ik[:5], c.ik[5:], c.layout, c.cfg)
    assert not sel.scored.any()
    by_key = {}
    for node, (a, path) in enumerate(node_paths(c.layout)):
        by_key.setdefault((a, len(path)), []).append(sel.positions[5 + node])
    assert all(all(torch.equal(x, rows[0]) for x in rows) for rows in by_key.values())
    assert max(len(rows) for rows in by_key.values()) >= 5
    # two identical chains at the same anchor: equal inputs -> equal selections in positions
    layout = build_tree_layout(12, [10, 10], [[-1, 0, 1], [-1, 0, 1]])
    d = make_sparse_case("chain", 12, 2, 1, seed=4)
    iq, ik = d.iq[:15].clone(), d.ik[:15].clone()
    iq, ik = torch.cat([iq, iq[12:]]), torch.cat([ik, ik[12:]])
    s = qsa_tree_select(iq, ik[:12], ik[12:], layout, d.cfg)
    assert s.scored[12:].all() and torch.equal(s.positions[12:15], s.positions[15:18])
    assert torch.equal(s.indices[15:18] - 3 * (s.indices[15:18] >= 12), s.indices[12:15])


# ------------------------------------------------------------------------------------------------ Triton

TRITON_GRID = [  # (shape, prefix, ratio, block_topk, hq, hkv, head dim, dtype, cached)
    ("chain", 7, 2, 3, 4, 4, 16, torch.float32, False),
    ("random", 9, 2, 2, 6, 2, 64, torch.float32, True),
    ("star", 20, 4, 4, 8, 1, 32, torch.bfloat16, False),
    ("random", 30, 4, 16, 6, 3, 64, torch.bfloat16, True),  # W = 67: two key tiles of 64
]


@pytest.mark.parametrize("shape,p,ratio,kb,hq,hkv,d,dtype,cached", TRITON_GRID)
def test_triton_matches_reference(shape, p, ratio, kb, hq, hkv, d, dtype, cached):
    c = make_sparse_case(shape, p, ratio, kb, hq=hq, hkv=hkv, d=d, dtype=dtype, depth=4, seed=p)
    out, _, idx = qsa_tree_naive(c.q, c.k, c.v, c.iq, c.ik, c.layout, c.cfg)
    with torch.no_grad():
        if cached:
            kv = (c.k[:p].to(DEVICE), c.v[:p].to(DEVICE))
            got, sel = qsa_tree_attention(*(x[p:].to(DEVICE) for x in (c.q, c.k, c.v, c.iq, c.ik)),
                                          c.layout.to(DEVICE), c.cfg, prefix_kv=kv, prefix_index_k=c.ik[:p].to(DEVICE),
                                          backend="triton")
            want, idx = out[p:], idx[p:]
        else:
            got, sel = qsa_tree_attention(*(x.to(DEVICE) for x in (c.q, c.k, c.v, c.iq, c.ik)), c.layout.to(DEVICE),
                                          c.cfg, backend="triton")
            want = out
    assert got.dtype == dtype and torch.equal(sel.indices.cpu(), idx)
    torch.testing.assert_close(got.float().cpu(), want.float(), **_tol(dtype))


def test_triton_unsorted_indices_empty_rows_and_scale():
    """Indices in any order with gaps (compacted by the wrapper), a row with no key (zeros), an explicit scale."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(4, 4, 16, generator=gen)
    k, v = torch.randn(9, 2, 16, generator=gen), torch.randn(9, 2, 16, generator=gen)
    idx = torch.tensor([[3, -1, 0, 8], [-1, -1, -1, -1], [5, 5, -1, 1], [-1, 2, -1, -1]])
    want = sparse_attention_naive(q, k, v, idx, scale=0.3)
    assert torch.equal(want[1], torch.zeros(4, 16))
    with torch.no_grad():
        got = tri.sparse_attention_triton(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), idx.to(DEVICE), scale=0.3)
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sparse_attention_torch(q, k, v, idx, scale=0.3), want, atol=1e-5, rtol=1e-5)
    assert tri.compact_indices(idx)[0][0].tolist() == [3, 0, 8, -1]


def test_backend_choice_and_errors(monkeypatch):
    monkeypatch.delenv("SPECOPD_SPARSE_ATTENTION", raising=False)
    assert sparse_attention_backend_name("cpu") == "torch"
    assert get_sparse_attention("cpu", "torch") is sparse_attention_torch
    monkeypatch.setenv("SPECOPD_SPARSE_ATTENTION", "triton")
    assert sparse_attention_backend_name("cpu") == "triton"  # TRITON_INTERPRET=1 in this module
    with pytest.raises(ValueError, match="unknown sparse-attention backend"):
        sparse_attention_backend_name("cpu", "flash")
    c = make_sparse_case("chain", 6, 2, 1, seed=1)
    with pytest.raises(ValueError, match="prefix_index_k"):
        qsa_tree_attention(c.q[6:], c.k[6:], c.v[6:], c.iq[6:], c.ik[6:], c.layout, c.cfg, prefix_kv=(c.k, c.v))
    with pytest.raises(ValueError, match="layout expects"):
        qsa_tree_attention(c.q[1:], c.k[1:], c.v[1:], c.iq[1:], c.ik[1:], c.layout, c.cfg)
    with pytest.raises(ValueError, match="do not match the layout"):
        qsa_tree_select(c.iq, c.ik[:5], c.ik[6:], c.layout, c.cfg)
    idx = torch.tensor([[0, c.q.shape[0]]])
    with pytest.raises(ValueError, match="out of range"):
        sparse_attention_torch(c.q[:1], c.k, c.v, idx)
    with pytest.raises(ValueError, match="forward only"):
        tri.sparse_attention_triton(c.q[:1].requires_grad_(), c.k, c.v, idx[:, :1])
    with pytest.raises(TypeError, match="fp32/bf16/fp16"):
        tri.sparse_attention_triton(c.q[:1].double().detach(), c.k.double(), c.v.double(), idx[:, :1])
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            tri.sparse_attention_triton(c.q[:1].detach(), c.k, c.v, idx[:, :1])
        with pytest.raises(ValueError, match="cannot run on cpu"):
            sparse_attention_backend_name("cpu")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    bad_configs = (dict(budget=4, compress_ratio=1), dict(budget=5, compress_ratio=2),
                   dict(budget=4, compress_ratio=2, rotary_dim=3))
    for bad in bad_configs:
        with pytest.raises(ValueError):
            QSAConfig(**bad)


# ------------------------------------------------------------------------------------------------ fuzz

@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10 ** 6), p=st.integers(1, 14), ratio=st.integers(2, 4), kb=st.integers(1, 3),
       trees=st.integers(0, 3))
def test_fuzz_tree_select_matches_reference(seed, p, ratio, kb, trees):
    rng = random.Random(seed)
    anchors = [rng.randrange(p) for _ in range(trees)]
    layout = build_tree_layout(p, anchors, [random_parents(rng, rng.randint(0, 7)) for _ in anchors])
    t = p + layout.num_nodes
    gen = torch.Generator().manual_seed(seed)
    cfg = QSAConfig(budget=ratio * kb, compress_ratio=ratio, k_norm_weight=torch.randn(8, generator=gen),
                    rotary_dim=4)
    iq, ik = torch.randn(t, 2, 8, generator=gen), torch.randn(t, 8, generator=gen)
    q, k = torch.randn(t, 2, 8, generator=gen), torch.randn(t, 1, 8, generator=gen)
    out, pos, idx = qsa_tree_naive(q, k, k, iq, ik, layout, cfg)
    sel = qsa_tree_select(iq, ik[:p], ik[p:], layout, cfg)
    assert torch.equal(sel.positions, pos) and torch.equal(sel.indices, idx)
    torch.testing.assert_close(sparse_attention_torch(q, k, k, sel.indices), out, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ served precision

def test_rope_callable_and_score_dtype():
    """``QSAConfig.rope`` replaces the theta formula (a served layer passes its own cos / sin cache); a callable
    equal to the formula selects identically. ``score_dtype`` rounds the compressed keys after RoPE: the tree
    selection still equals each branch decoded sequentially with the same rounding, and the keys are the rounded
    fp32 ones."""
    import dataclasses

    from specopd_kernels.sparse.indexer import apply_rope, qsa_block_keys

    c = make_sparse_case("random", 13, 2, 3, depth=5, seed=11)
    calls = []

    def rope(x, pos):
        calls.append(x.shape[0])
        return apply_rope(x, pos, c.cfg.rotary_dim, c.cfg.rope_theta, c.cfg.neox_style)

    with_rope = dataclasses.replace(c.cfg, rope=rope)
    base = qsa_tree_select(c.iq, c.ik[:13], c.ik[13:], c.layout, c.cfg)
    via = qsa_tree_select(c.iq, c.ik[:13], c.ik[13:], c.layout, with_rope)
    assert calls and torch.equal(base.indices, via.indices)
    groups, first = c.ik[:12].reshape(6, 2, -1), torch.arange(6) * 2
    bf = dataclasses.replace(c.cfg, score_dtype=torch.bfloat16)
    keys = qsa_block_keys(groups, first, bf)
    assert keys.dtype == torch.bfloat16 and torch.equal(keys, qsa_block_keys(groups, first, c.cfg).to(torch.bfloat16))
    iq = c.iq.to(torch.bfloat16)
    sel = qsa_tree_select(iq, c.ik[:13], c.ik[13:], c.layout, bf)
    _, pos, idx = qsa_tree_naive(c.q, c.k, c.v, iq, c.ik, c.layout, bf)
    assert torch.equal(sel.positions, pos) and torch.equal(sel.indices, idx)
