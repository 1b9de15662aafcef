"""Proposal-tree packing, tree masks, FlashInfer mask packing and the reference tree attention."""

import random

import numpy as np
import pytest
import torch

from specopd_kernels.tree import (
    branches_to_parents,
    build_tree_mask,
    build_tree_mask_loop,
    flashinfer_custom_mask,
    pack_branches,
    pack_proposal_tree,
    pack_trees_varlen,
    packbits,
    segment_packbits,
    tree_attention_reference,
    unpackbits,
)


def _random_tree(rng: random.Random, vocab: int = 50):
    p = rng.randint(1, 10)
    anchors = [rng.randrange(p) for _ in range(rng.randint(1, 4))]
    toks, pars = [], []
    for _ in anchors:
        n = rng.randint(0, 6)
        toks.append([rng.randrange(vocab) for _ in range(n)])
        pars.append([rng.randint(-1, i - 1) for i in range(n)])
    if sum(len(t) for t in toks) == 0:
        toks[0], pars[0] = [1], [-1]
    prefix = [rng.randrange(vocab) for _ in range(p)]
    return prefix, anchors, toks, pars


def test_mask_matches_loop_reference_and_position_rule():
    rng = random.Random(0)
    for _ in range(400):
        prefix, anchors, toks, pars = _random_tree(rng)
        tree = pack_proposal_tree(prefix, anchors, toks, pars, vocab_size=50)
        loop = build_tree_mask_loop(tree.prefix_len, tree.node_anchor, tree.node_parent)
        assert torch.equal(tree.mask(), loop)
        # positions: walk parents by hand; depth m -> a + 1 + m
        p = len(prefix)
        assert tree.positions[:p].tolist() == list(range(p))
        for i in range(tree.num_nodes):
            m, k = 0, int(tree.node_parent[i])
            while k != -1:
                m, k = m + 1, int(tree.node_parent[k])
            assert int(tree.node_depth[i]) == m
            assert int(tree.positions[p + i]) == int(tree.node_anchor[i]) + 1 + m
        flat_toks = [t for ts in toks for t in ts]
        assert tree.input_ids.tolist() == prefix + flat_toks


def test_hand_written_mask_two_branches():
    # prefix of 3 tokens, anchor 1, branches [7, 8] and [9]
    tree = pack_branches([10, 11, 12], [1], [[[7, 8], [9]]], block_size=4)
    assert tree.node_parent.tolist() == [-1, 0, -1]
    assert tree.positions.tolist() == [0, 1, 2, 2, 3, 2]
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],  # node 7: prefix 0..1 + itself
        [1, 1, 0, 1, 1, 0],  # node 8: prefix 0..1 + 7 + itself
        [1, 1, 0, 0, 0, 1],  # node 9: prefix 0..1 + itself
    ], dtype=torch.bool)
    assert torch.equal(tree.mask(), expected)


def test_branches_to_parents():
    assert branches_to_parents([2, 3]).tolist() == [-1, 0, -1, 2, 3]
    assert branches_to_parents([0, 1, 0]).tolist() == [-1]
    assert branches_to_parents([3]).tolist() == [-1, 0, 1]
    with pytest.raises(ValueError, match="must be >= 0"):
        branches_to_parents([2, -1])


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(prefix_ids=[1, 2], anchors=[2], node_tokens=[[3]]), ValueError, r"anchor 2 out of range \[0, 2\)"),
    (dict(prefix_ids=[1, 2], anchors=[-1], node_tokens=[[3]]), ValueError, r"anchor -1 out of range"),
    (dict(prefix_ids=[], anchors=[0], node_tokens=[[3]]), ValueError, "empty input: prefix_ids is empty"),
    (dict(prefix_ids=[1], anchors=[], node_tokens=[]), ValueError, "empty input: no tree nodes"),
    (dict(prefix_ids=[1], anchors=[0], node_tokens=[[3, 4]], node_parents=[[-1, 1]]), ValueError,
     r"node_parents\[0\]\[1\]=1 is a self/forward reference \(cycle\)"),
    (dict(prefix_ids=[1], anchors=[0], node_tokens=[[3, 4]], node_parents=[[1, 0]]), ValueError,
     r"node_parents\[0\]\[0\]=1 is a self/forward reference"),
    (dict(prefix_ids=[1], anchors=[0], node_tokens=[[3, 4]], node_parents=[[-1, 5]]), ValueError,
     r"node_parents\[0\]\[1\]=5 out of range"),
    (dict(prefix_ids=[1], anchors=[0], node_tokens=[[3, 4]], node_parents=[[-2, 0]]), ValueError,
     r"out of range: must be -1"),
    (dict(prefix_ids=[1, 99], anchors=[0], node_tokens=[[3]], vocab_size=50), ValueError,
     r"prefix token id 99 outside \[0, 50\)"),
    (dict(prefix_ids=[1], anchors=[0], node_tokens=[[3, -4]], vocab_size=50), ValueError,
     r"anchor 0 node token id -4 outside"),
    (dict(prefix_ids=[1], anchors=[0], node_tokens=[[1, 2, 3, 4]], block_size=4), ValueError,
     r"has 4 tokens > block_size-1 = 3"),
    (dict(prefix_ids=[1.5], anchors=[0], node_tokens=[[3]]), TypeError, "must hold integers"),
])
def test_pack_validation_errors(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        pack_proposal_tree(**kwargs)


def test_pack_branches_and_build_mask_validation():
    with pytest.raises(ValueError, match=r"branch 1 at anchor index 0 has length 4 > block_size-1 = 3"):
        pack_branches([1, 2], [0], [[[1], [1, 2, 3, 4]]], block_size=4)
    tree = pack_branches([1, 2], [0, 1], [[[5, 6, 7]], [[8]]], block_size=4)  # length == block_size-1 is ok
    assert tree.positions.tolist() == [0, 1, 1, 2, 3, 2]
    with pytest.raises(ValueError, match="belong to different anchors"):
        build_tree_mask(3, [0, 1], [-1, 0])
    with pytest.raises(ValueError, match=r"anchor 3 out of range \[0, 3\)"):
        build_tree_mask(3, [3], [-1])
    with pytest.raises(ValueError, match="node_parent\\[0\\]=0 is a self/forward reference"):
        build_tree_mask(3, [0], [0])


def test_packed_trees_varlen():
    a = pack_branches([1, 2, 3], [2], [[[4, 5]]], block_size=4)
    b = pack_proposal_tree([6], [0], [[7, 8, 9]], [[-1, 0, 0]])
    batch = pack_trees_varlen([a, b])
    assert batch.cu_seqlens.dtype == torch.int32 and batch.cu_seqlens.tolist() == [0, 5, 9]
    assert batch.input_ids[batch.node_index].tolist() == [4, 5, 7, 8, 9]
    assert batch.positions.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 2]
    assert batch.node_row.tolist() == [0, 0, 1, 1, 1]
    assert torch.equal(batch.block_mask(), torch.block_diag(a.mask().int(), b.mask().int()).bool())
    fm = batch.flashinfer_mask()
    assert fm.qo_indptr.tolist() == [0, 5, 9] and fm.kv_indptr.tolist() == [0, 5, 9]
    assert fm.mask_indptr.tolist() == [0, 25, 41] and fm.packed_indptr.tolist() == [0, 4, 6]
    with pytest.raises(ValueError, match="empty input"):
        pack_trees_varlen([])
    with pytest.raises(TypeError, match="expected ProposalTree"):
        pack_trees_varlen([a, "b"])


def test_packbits_numpy_semantics_and_round_trip():
    # flashinfer docstring examples (big bit order)
    assert packbits(torch.tensor([1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)).tolist() == [0b10110011]
    x = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1], dtype=torch.bool)
    y, ip = segment_packbits(x, torch.tensor([0, 4, 7, 11]), bitorder="big")
    assert y.tolist() == [0b10110000, 0b00100000, 0b11010000] and ip.tolist() == [0, 1, 2, 3]
    assert ip.dtype == torch.int32
    y, _ = segment_packbits(x, torch.tensor([0, 4, 7, 11]))  # little: element i -> bit i
    assert y.tolist() == [0b00001101, 0b00000100, 0b00001011]
    gen = torch.Generator().manual_seed(0)
    for n in range(0, 41):
        bits = torch.rand(n, generator=gen) < 0.5
        for order in ("big", "little"):
            packed = packbits(bits, order)
            assert packed.tolist() == np.packbits(bits.numpy(), bitorder=order).tolist()
            assert torch.equal(unpackbits(packed, n, order), bits)
    with pytest.raises(ValueError, match="bitorder must be"):
        packbits(bits, "middle")
    with pytest.raises(TypeError, match="uint8"):
        unpackbits(torch.zeros(1, dtype=torch.int32), 3)


def _segment_packbits_loop(bits, indptr, order):
    out, new = [], [0]
    for s, e in zip(indptr[:-1], indptr[1:]):
        seg = bits[s:e]
        for j in range(0, len(seg), 8):
            byte = 0
            for i, b in enumerate(seg[j:j + 8]):
                byte |= int(b) << (i if order == "little" else 7 - i)
            out.append(byte)
        new.append(len(out))
    return out, new


def test_segment_packbits_matches_loop_reference():
    rng = random.Random(1)
    for _ in range(60):
        lens = [rng.randint(0, 30) for _ in range(rng.randint(1, 5))]
        indptr = [0]
        for n in lens:
            indptr.append(indptr[-1] + n)
        bits = [rng.random() < 0.5 for _ in range(indptr[-1])]
        for order in ("big", "little"):
            y, ip = segment_packbits(torch.tensor(bits, dtype=torch.bool), torch.tensor(indptr), order)
            ref, ref_ip = _segment_packbits_loop(bits, indptr, order)
            assert y.tolist() == ref and ip.tolist() == ref_ip
    with pytest.raises(ValueError, match="indptr must start at 0"):
        segment_packbits(torch.ones(5, dtype=torch.bool), torch.tensor([0, 3, 4]))


def test_flashinfer_custom_mask_layout():
    m0 = torch.tensor([[1, 0, 0], [1, 1, 0]], dtype=torch.bool)  # q_len 2, kv_len 3
    m1 = torch.ones(1, 9, dtype=torch.bool)
    fm = flashinfer_custom_mask([m0, m1])
    assert fm.custom_mask.tolist() == [True, False, False, True, True, False] + [True] * 9
    assert fm.qo_indptr.tolist() == [0, 2, 3] and fm.kv_indptr.tolist() == [0, 3, 12]
    assert fm.mask_indptr.tolist() == [0, 6, 15] and fm.packed_indptr.tolist() == [0, 1, 3]
    assert fm.packed_mask.tolist() == [0b011001, 0xFF, 0x01]
    with pytest.raises(TypeError, match="must be a bool tensor"):
        flashinfer_custom_mask([m0.int()])


class _TinyModel:
    """2-layer attention-only model whose q/k/v depend only on (token, position): tree vs sequence check."""

    def __init__(self, vocab=32, dm=16, hq=4, hkv=2, d=8, max_pos=32, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(vocab, dm, generator=g)
        self.pos = torch.randn(max_pos, dm, generator=g)
        self.layers = [[torch.randn(dm, h * d, generator=g) / dm ** 0.5 for h in (hq, hkv, hkv)]
                       + [torch.randn(hq * d, dm, generator=g) / (hq * d) ** 0.5] for _ in range(2)]
        self.hq, self.hkv, self.d = hq, hkv, d

    def __call__(self, ids, positions, mask):
        h = self.emb[ids] + self.pos[positions]
        t = h.shape[0]
        for wq, wk, wv, wo in self.layers:
            q = (h @ wq).view(t, self.hq, self.d)
            k = (h @ wk).view(t, self.hkv, self.d)
            v = (h @ wv).view(t, self.hkv, self.d)
            h = h + tree_attention_reference(q, k, v, mask).reshape(t, -1) @ wo
        return h


def test_tree_attention_equals_each_path_run_alone():
    model = _TinyModel()
    rng = random.Random(3)
    prefix = [rng.randrange(32) for _ in range(9)]
    trees = [pack_branches(prefix, [2, 5, 8], [[[1, 2, 3], [4, 5]], [[6]], [[7, 8, 9], [10]]], block_size=4),
             pack_proposal_tree(prefix, [4, 6], [[11, 12, 13, 14, 15], [16, 17]], [[-1, 0, 0, 2, -1], [-1, 0]])]
    for tree in trees:
        out = model(tree.input_ids, tree.positions, tree.mask())
        p = tree.prefix_len
        causal = torch.ones(p, p, dtype=torch.bool).tril()
        assert torch.allclose(out[:p], model(tree.input_ids[:p], tree.positions[:p], causal), atol=1e-5)
        for i in range(tree.num_nodes):
            path, k = [], i
            while k != -1:
                path.append(p + k)
                k = int(tree.node_parent[k])
            a = int(tree.node_anchor[i])
            ids = torch.cat([tree.input_ids[:a + 1], tree.input_ids[path[::-1]]])
            n = ids.numel()
            alone = model(ids, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril())
            assert torch.allclose(out[p + i], alone[-1], atol=1e-5), (i, (out[p + i] - alone[-1]).abs().max())


def test_tree_attention_reference_matches_sdpa_and_validates():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(7, 4, 8, generator=g), torch.randn(7, 2, 8, generator=g), torch.randn(7, 2, 8, generator=g)
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(2, 1).transpose(0, 1), v.repeat_interleave(2, 1).transpose(0, 1),
        is_causal=True).transpose(0, 1)
    assert torch.allclose(tree_attention_reference(q, k, v, mask), ref, atol=1e-5)
    out16 = tree_attention_reference(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    assert out16.dtype == torch.bfloat16 and torch.allclose(out16.float(), ref, atol=5e-2)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        tree_attention_reference(torch.randn(7, 3, 8), k, v, mask)
    with pytest.raises(ValueError, match="may attend to nothing"):
        tree_attention_reference(q, k, v, torch.zeros(7, 7, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be bool"):
        tree_attention_reference(q, k, v, mask.int())
