"""Trie packing of sampled branches, grouped tree attention and the proposal-tree losses (SpecOPD step pieces)."""

import random

import pytest
import torch

from specopd_kernels.losses import (chunked_tree_alpha, get_loss, tree_alpha, tree_alpha_reference, tree_loss,
                                    tree_loss_and_alpha)
from specopd_kernels.tree import build_tree_layout, build_tree_mask, tree_attention_grouped, tree_attention_reference
from specopd_trainer.loops.branch_tree import pack_branches


def test_pack_branches_hand_case():
    # one anchor, 3 branches of G=3 tokens; the first 2 tokens are scored
    br = torch.tensor([[[1, 2, 3], [1, 2, 4], [5, 2, 3]]])
    pk = pack_branches(br, scored_depth=2)
    assert pk.tokens == [[1, 2, 5, 2]]
    assert pk.parents == [[-1, 0, -1, 2]]
    # rows: anchor row 0, then nodes 1..4 (offset 1)
    assert pk.row_index.tolist() == [[0, 1, 2], [0, 1, 2], [0, 3, 4]]
    assert pk.row_anchor.tolist() == [0, 0, 0, 0, 0]
    assert pk.row_slot.tolist() == [0, 1, 2, 1, 2]
    assert pk.num_nodes == 4


def test_pack_branches_two_anchors_offsets():
    br = torch.tensor([[[7, 8], [7, 9]], [[7, 8], [7, 8]]])
    pk = pack_branches(br, scored_depth=1)
    assert pk.tokens == [[7], [7]]
    assert pk.row_index.tolist() == [[0, 2], [0, 2], [1, 3], [1, 3]]
    assert pk.row_anchor.tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="scored_depth"):
        pack_branches(br, scored_depth=3)
    with pytest.raises(ValueError, match=r"\[A, K, G\]"):
        pack_branches(br[0], scored_depth=1)


def _random_trees(rng, prefix_len):
    anchors, parents = [], []
    for _ in range(rng.randint(0, 4)):
        n = rng.randint(0, 6)
        anchors.append(rng.randrange(prefix_len))
        parents.append([-1 if i == 0 or rng.random() < 0.3 else rng.randrange(i) for i in range(n)])
    return anchors, parents


@pytest.mark.parametrize("hq,hkv", [(4, 4), (6, 2), (9, 3)])
@pytest.mark.parametrize("seed", range(6))
def test_grouped_tree_attention_matches_dense_mask(seed, hq, hkv):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    p = rng.randint(1, 14)
    anchors, parents = _random_trees(rng, p)
    layout = build_tree_layout(p, anchors, parents)
    offsets = [0]
    for ps in parents:
        offsets.append(offsets[-1] + len(ps))
    node_anchor = torch.tensor([a for a, ps in zip(anchors, parents) for _ in ps], dtype=torch.long)
    node_parent = torch.tensor([-1 if x == -1 else x + offsets[g] for g, ps in enumerate(parents) for x in ps],
                               dtype=torch.long)
    mask = build_tree_mask(p, node_anchor, node_parent)
    t = p + node_anchor.numel()
    q = torch.randn(t, hq, 8, requires_grad=True)
    k = torch.randn(t, hkv, 8, requires_grad=True)
    v = torch.randn(t, hkv, 8, requires_grad=True)
    out = tree_attention_grouped(q, k, v, layout)
    ref = tree_attention_reference(q, k, v, mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    w = torch.randn_like(out)
    g_out = torch.autograd.grad((out * w).sum(), (q, k, v))
    g_ref = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(g_out, g_ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (9, 3)])
@pytest.mark.parametrize("seed", range(6))
def test_grouped_tree_attention_with_cached_prefix_kv(seed, hq, hkv):
    """Node rows against a prefix's recorded K/V (``prefix_kv``, the score_trees prefix cache) equal the node rows
    of the full-row attention, in value and in gradient w.r.t. the node q/k/v."""
    rng = random.Random(100 + seed)
    torch.manual_seed(seed)
    p = rng.randint(1, 14)
    anchors, parents = _random_trees(rng, p)
    layout = build_tree_layout(p, anchors, parents)
    t = p + layout.num_nodes
    q, k, v = torch.randn(t, hq, 8), torch.randn(t, hkv, 8), torch.randn(t, hkv, 8)
    qn, kn, vn = (x[p:].clone().requires_grad_() for x in (q, k, v))
    full = tree_attention_grouped(torch.cat([q[:p], qn]), torch.cat([k[:p], kn]), torch.cat([v[:p], vn]), layout)
    cached = tree_attention_grouped(qn, kn, vn, layout, prefix_kv=(k[:p], v[:p]))
    assert cached.shape == (layout.num_nodes, hq, 8)
    torch.testing.assert_close(cached, full[p:], atol=1e-6, rtol=1e-6)
    if layout.num_nodes:
        w = torch.randn_like(cached)
        g_full = torch.autograd.grad((full[p:] * w).sum(), (qn, kn, vn))
        g_cached = torch.autograd.grad((cached * w).sum(), (qn, kn, vn))
        for a, b in zip(g_cached, g_full):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_grouped_tree_attention_rejects_wrong_row_length():
    layout = build_tree_layout(4, [1], [[-1, 0]])
    q = torch.randn(5, 2, 4)
    with pytest.raises(ValueError, match="layout expects 4 \\+ 2"):
        tree_attention_grouped(q, q, q, layout)
    with pytest.raises(ValueError, match="node rows only"):
        tree_attention_grouped(q, q, q, layout, prefix_kv=(q[:4], q[:4]))  # 5 rows given, 2 nodes expected
    with pytest.raises(ValueError, match="prefix K/V have 3 / 3 rows, layout expects 4"):
        tree_attention_grouped(q[:2], q[:2], q[:2], layout, prefix_kv=(q[:3], q[:3]))
    with pytest.raises(ValueError, match="out of range"):
        build_tree_layout(4, [4], [[-1]])


def test_tree_alpha_hand_case():
    # two rows over V=2: p = softmax(0, 0) = (.5, .5); q row 0 = (.5, .5) -> alpha 1; q row 1 = softmax(log 3, 0)
    # = (.75, .25) -> alpha = .5 + .25 = .75. Branches: [row0, row1], [row0, row0].
    p = torch.zeros(2, 2)
    q = torch.tensor([[0.0, 0.0], [torch.log(torch.tensor(3.0)).item(), 0.0]])
    idx = torch.tensor([[0, 1], [0, 0]])
    rd = torch.tensor([0, 1])
    alpha = tree_alpha(p, q, rd, idx)
    torch.testing.assert_close(alpha, torch.tensor([[1.0, 0.75], [1.0, 1.0]]))
    # E2E-TV: branch 0: 1 - (1 + .75)/2 = .125; branch 1: 0 -> mean .0625
    assert tree_loss("e2e_tv", p, q, rd, idx).item() == pytest.approx(0.0625)
    # per-token TV: multiplicity-weighted: (0 + .25 + 0 + 0) / 4
    assert tree_loss("tv", p, q, rd, idx).item() == pytest.approx(0.0625)
    # both target rows compared with draft row 0 -> every alpha is 1
    assert tree_loss("e2e_tv", p, q, torch.tensor([0, 0]), idx).item() == pytest.approx(0.0)


@pytest.mark.parametrize("name", ["e2e_tv", "e2e_fkl", "tv", "fkl", "rkl"])
def test_tree_loss_equals_expanded_branches(name):
    torch.manual_seed(1)
    a, k, g, v = 3, 5, 4, 11
    pk = pack_branches(torch.randint(0, 2, (a, k, g)), g - 1)  # many shared prefixes
    r = pk.row_anchor.numel()
    assert r < a + a * k * (g - 1)
    q = torch.randn(a, g, v, requires_grad=True)
    p_rows = torch.randn(r, v)
    tree = tree_loss(name, p_rows, q.reshape(a * g, v), pk.row_anchor * g + pk.row_slot, pk.row_index)
    (g_tree,) = torch.autograd.grad(tree, q)
    expanded = get_loss(name)(p_rows[pk.row_index], q[:, None].expand(a, k, g, v).reshape(a * k, g, v))
    (g_exp,) = torch.autograd.grad(expanded, q)
    assert tree.item() == pytest.approx(expanded.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(g_tree, g_exp, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_e2e_fkl_is_tree_equals_expanded_branches(temperature):
    """The tree form reads each branch's drafted tokens from row_token and equals the expanded loss, value and
    gradient; with every branch distinct the weights differ from E2E-KL's."""
    torch.manual_seed(2)
    a, k, g, v = 3, 5, 4, 11
    branches = torch.randint(0, 3, (a, k, g))
    pk = pack_branches(branches, g - 1)
    assert pk.row_token[:a].tolist() == [-1] * a
    q = torch.randn(a, g, v, requires_grad=True)
    p_rows = torch.randn(pk.row_anchor.numel(), v)
    rd = pk.row_anchor * g + pk.row_slot
    tree = tree_loss("e2e_fkl_is", p_rows, q.reshape(a * g, v), rd, pk.row_index, row_token=pk.row_token,
                     sample_temperature=temperature)
    (g_tree,) = torch.autograd.grad(tree, q)
    expanded = get_loss("e2e_fkl_is")(p_rows[pk.row_index], q[:, None].expand(a, k, g, v).reshape(a * k, g, v),
                                      branches.reshape(a * k, g), temperature)
    (g_exp,) = torch.autograd.grad(expanded, q)
    assert tree.item() == pytest.approx(expanded.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(g_tree, g_exp, atol=1e-6, rtol=1e-5)
    plain = tree_loss("e2e_fkl", p_rows, q.reshape(a * g, v), rd, pk.row_index)
    assert abs(plain.item() - tree.item()) > 1e-4
    with pytest.raises(ValueError, match="needs row_token"):
        tree_loss("e2e_fkl_is", p_rows, q.reshape(a * g, v), rd, pk.row_index)


def test_e2e_fkl_is_with_greedy_path_branches_hand_weights():
    """lambda mixes the sampled branches' accepted-prefix weights with T=0 weights on greedy-path branches, whose
    slot i counts only where the drafter's argmax matched the path on every earlier slot (checked against the
    per-branch KL with weights written out)."""
    from specopd_kernels.losses import accepted_prefix_weights, draft_accept_ratio, forward_kl

    torch.manual_seed(4)
    a, k, g, v = 2, 3, 4, 9
    q = torch.randn(a, g, v, requires_grad=True)
    argmax = q.detach().argmax(-1)  # [A, G]
    sampled = torch.randint(0, v, (a, k, g))
    greedy = argmax.clone()
    greedy[0, 2] = (argmax[0, 2] + 1) % v  # anchor 0: the path leaves the drafter's argmax at slot 3
    greedy[1, 3] = -1  # anchor 1: the reference ends after slot 3
    branches = torch.cat([sampled, greedy.clamp(min=0)[:, None]], 1)  # [A, K+1, G]
    pk = pack_branches(branches, g - 1)
    p_rows = torch.randn(pk.row_anchor.numel(), v)
    rd = pk.row_anchor * g + pk.row_slot
    gb = torch.arange(a) * (k + 1) + k
    lam = 0.3
    loss = tree_loss("e2e_fkl_is", p_rows, q.reshape(a * g, v), rd, pk.row_index, row_token=pk.row_token,
                     greedy_branches=gb, greedy_tokens=greedy, greedy_weight=lam)
    (grad,) = torch.autograd.grad(loss, q)
    # by hand: expanded per-branch KL and the two weight families
    n = a * (k + 1)
    pe = p_rows[pk.row_index]
    qe = q[:, None].expand(a, k + 1, g, v).reshape(n, g, v)
    kl = forward_kl(pe, qe, reduction="none")
    with torch.no_grad():
        alpha = torch.minimum(torch.softmax(pe, -1), torch.softmax(qe, -1)).sum(-1)
        c_is = accepted_prefix_weights(alpha, draft_accept_ratio(pe, qe, branches.reshape(n, g))[:, : g - 1])
    # E2E weights of the hits: anchor 0 hits (1, 1, 0, 1): slot 3 is reached (and would extend to slot 4), slot
    # 4 is not; anchor 1 hits (1, 1, 1, past the end): the last slot weighs nothing
    c0 = torch.tensor([[1.0 + 1, 1, 1 + 1, 0], [1.0 + 1 + 1, 1 + 1, 1, 0]])
    w = c_is * (1 - lam) / (a * k)
    w[gb] = c0 * lam / a
    expected = (w * kl).sum() / g
    (g_exp,) = torch.autograd.grad(expected, q)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    torch.testing.assert_close(grad, g_exp, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="term of e2e_fkl_is"):
        tree_loss("e2e_fkl", p_rows, q.reshape(a * g, v), rd, pk.row_index, greedy_branches=gb, greedy_tokens=greedy)
    with pytest.raises(ValueError, match="greedy_tokens must be int64"):
        tree_loss("e2e_fkl_is", p_rows, q.reshape(a * g, v), rd, pk.row_index, row_token=pk.row_token,
                  greedy_branches=gb, greedy_tokens=greedy[:, :2])
    with pytest.raises(ValueError, match="greedy_weight"):
        tree_loss("e2e_fkl_is", p_rows, q.reshape(a * g, v), rd, pk.row_index, row_token=pk.row_token,
                  greedy_branches=gb, greedy_tokens=greedy, greedy_weight=1.0)


def test_tree_loss_bad_input():
    p = torch.zeros(2, 3)
    with pytest.raises(KeyError, match="no proposal-tree form"):
        tree_loss("ce_decay", p, p, torch.arange(2), torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="row_index entries"):
        tree_loss("e2e_tv", p, p, torch.arange(2), torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="row_draft has 1 entries"):
        tree_loss("tv", p, p, torch.tensor([0]), torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        tree_loss("fkl", p, torch.zeros(2, 4), torch.arange(2), torch.tensor([[0, 1]]))


@pytest.mark.parametrize("r,nq,v,chunk", [(1, 1, 5, 64), (63, 4, 97, 64), (64, 4, 97, 64), (65, 7, 97, 64),
                                          (200, 16, 1000, 7), (37, 5, 257, 1), (65, 3, 49152, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_tree_alpha_matches_reference(r, nq, v, chunk, dtype):
    torch.manual_seed(r * 7 + v)
    target = (torch.randn(r, v) * 3).to(dtype)
    draft = (torch.randn(nq, v) * 3).to(dtype).requires_grad_()
    row_draft = torch.randint(nq, (r,))
    n, g = 2 * r, 5
    row_index = torch.randint(r, (n, g))
    w = torch.rand(n, g)
    got = chunked_tree_alpha(target, draft, row_draft, chunk_rows=chunk)[row_index]
    ref = tree_alpha_reference(target, draft, row_draft, row_index)
    assert got.dtype == torch.float32 and got.shape == (n, g)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    (g_got,) = torch.autograd.grad((got * w).sum(), draft)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), draft)
    assert g_got.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(g_got.float(), g_ref.float(), atol=tol, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5)


def test_chunked_tree_alpha_hand_case_and_ties():
    # p = (.5, .5); q = (.75, .25): alpha = .5 + .25 = .75; d alpha / dq = 1[q < p] = (0, 1);
    # d alpha / d logits = q * (e - <e, q>) = (.75 * (0 - .25), .25 * (1 - .25)) = (-.1875, .1875)
    target = torch.zeros(1, 2)
    draft = torch.tensor([[torch.log(torch.tensor(3.0)).item(), 0.0]], requires_grad=True)
    alpha = chunked_tree_alpha(target, draft, torch.tensor([0]))
    assert alpha.item() == pytest.approx(0.75)
    (grad,) = torch.autograd.grad(alpha.sum(), draft)
    torch.testing.assert_close(grad, torch.tensor([[-0.1875, 0.1875]]))
    # q == p exactly: alpha = 1 is the maximum; the 1[q < p] rule gives zero gradient (no mass to move)
    same = torch.tensor([[0.3, -1.2, 2.0]])
    d = same.clone().requires_grad_()
    a = chunked_tree_alpha(same, d, torch.tensor([0]))
    assert a.item() == pytest.approx(1.0)
    assert torch.equal(torch.autograd.grad(a.sum(), d)[0], torch.zeros(1, 3))
    with pytest.raises(ValueError, match="chunk_rows"):
        chunked_tree_alpha(same, d, torch.tensor([0]), chunk_rows=0)


@pytest.mark.parametrize("name", ["e2e_tv", "tv"])
def test_tree_loss_and_alpha_returns_the_loss_and_its_alpha(name):
    torch.manual_seed(3)
    pk = pack_branches(torch.randint(0, 3, (2, 4, 3)), 2)
    q = torch.randn(2 * 3, 13, requires_grad=True)
    p_rows = torch.randn(pk.row_anchor.numel(), 13)
    rd = pk.row_anchor * 3 + pk.row_slot
    loss, alpha = tree_loss_and_alpha(name, p_rows, q, rd, pk.row_index)
    assert loss.item() == pytest.approx(tree_loss(name, p_rows, q, rd, pk.row_index).item())
    assert not alpha.requires_grad
    torch.testing.assert_close(alpha, tree_alpha_reference(p_rows, q, rd, pk.row_index).detach())
    assert tree_loss_and_alpha(name, p_rows, q, rd, pk.row_index, with_alpha=False)[1] is None


def test_e2e_tv_backend_dispatch_uses_triton_only_on_cuda(monkeypatch):
    """``e2e_tv`` picks the Triton kernel for CUDA tensors once the GPU acceptance run verified it (faster there,
    kernels_gpu.json; tests/test_verified_kernels.py) and the chunked torch path on CPU; ``e2e_tv_fused`` always
    takes Triton. Checked by recording which backend runs."""
    import specopd_kernels.losses.chunked as chunked_mod
    import specopd_kernels.losses.fused as fused_mod
    from specopd_kernels.losses.tree import _use_fused_kernel

    calls = []
    monkeypatch.setattr(fused_mod, "fused_acceptance_alpha",
                        lambda t, d: calls.append("fused") or tree_alpha_reference(t, d, torch.arange(len(d)),
                                                                                    torch.arange(len(d))[None])[0])
    real_chunked = chunked_mod.chunked_tree_alpha
    monkeypatch.setattr(chunked_mod, "chunked_tree_alpha", lambda *a: calls.append("chunked") or real_chunked(*a))
    p, q = torch.randn(3, 7), torch.randn(2, 7)
    rd, idx = torch.tensor([0, 1, 1]), torch.tensor([[0, 1], [0, 2]])
    tree_alpha(p, q, rd, idx, "e2e_tv")
    tree_alpha(p, q, rd, idx, "e2e_tv_fused")
    assert calls == ["chunked", "fused"]
    assert _use_fused_kernel(p) is False
    assert _use_fused_kernel(torch.empty(1, 1, device="meta")) is False


def test_e2e_fkl_tree_streams_rows_in_chunks():
    """The soft-target form of E2E-KL, accumulated over row chunks, equals the per-row weighted forward KL."""
    from specopd_kernels.losses import acceptance_weights, forward_kl
    from specopd_kernels.losses.tree import _e2e_fkl_tree

    torch.manual_seed(3)
    a, k, g, v = 4, 3, 5, 13
    pk = pack_branches(torch.randint(0, 3, (a, k, g)), g - 1)
    q = torch.randn(a * g, v, requires_grad=True)
    p_rows = torch.randn(pk.row_anchor.numel(), v)
    rd = pk.row_anchor * g + pk.row_slot
    loss, alpha = _e2e_fkl_tree(p_rows, q, rd, pk.row_index, True, chunk=3)
    (g_chunk,) = torch.autograd.grad(loss, q)
    w = torch.zeros(p_rows.shape[0]).index_add_(0, pk.row_index.reshape(-1),
                                                 (acceptance_weights(alpha) / g).reshape(-1))
    direct = (w * forward_kl(p_rows, q[rd], reduction="none")).sum() / pk.row_index.shape[0]
    (g_direct,) = torch.autograd.grad(direct, q)
    assert loss.item() == pytest.approx(direct.item(), rel=1e-5)
    torch.testing.assert_close(g_chunk, g_direct, atol=1e-6, rtol=1e-5)
