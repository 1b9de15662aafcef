"""Gated DeltaNet kernels (specopd_kernels.gdn): hand-checked recurrence and conv, split invariance, the chunked
form, indexed state replay vs scoring every node as its own sequence, and the Triton tree kernel vs the torch
replay under the Triton interpreter on CPU (the module fixture sets TRITON_INTERPRET=1 before any kernel is
built; on a CUDA machine the compiled kernel runs instead)."""

import math
import random

import pytest
import torch
import torch.nn.functional as F

from _gdn_cases import make_gdn_case
from support.triton import triton_interpret  # noqa: F401  (module fixture: TRITON_INTERPRET=1 on CPU)
from specopd_kernels.gdn import (GDNParams, build_gdn_tree_layout, causal_conv1d_naive, gdn_chunk, gdn_gates,
                                 gdn_layer_naive, gdn_layout_from_tree_layout, gdn_recurrent_naive, gdn_tree_naive,
                                 gdn_tree_replay, random_gdn_params, replay_prefix)
from specopd_kernels.gdn import triton_replay as tri
from specopd_kernels.tree import build_tree_layout, pack_proposal_tree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = dict(atol=1e-5, rtol=1e-5)
BF16 = dict(atol=1e-2, rtol=1e-2)


def _close(got, want, dtype=torch.float32):
    torch.testing.assert_close(got.float(), want.float(), **(F32 if dtype == torch.float32 else BF16))


def _on_device(case):
    return [x.to(DEVICE) if isinstance(x, (torch.Tensor, GDNParams)) else x for x in case.args()]


def _hand_inputs():
    # token 1: k=(1,0) v=(2,3) q=(1,1) exp(g)=.5 beta=.5 | token 2: k=(.6,.8) v=(1,-1) q=(0,2) exp(g)=.8 beta=1
    q = torch.tensor([[[1.0, 1.0]], [[0.0, 2.0]]])
    k = torch.tensor([[[1.0, 0.0]], [[0.6, 0.8]]])
    v = torch.tensor([[[2.0, 3.0]], [[1.0, -1.0]]])
    return q, k, v, torch.tensor([[0.5], [0.8]]).log(), torch.tensor([[0.5], [1.0]])


def test_recurrence_hand_cases():
    q, k, v, g, beta = _hand_inputs()
    # S1 = .5 * 0 + .5 (2,3) (1,0)^T = [[1,0],[1.5,0]], o1 = S1 q1 = (1, 1.5)
    # S2 = .8 S1 = [[.8,0],[1.2,0]]; S k2 = (.48,.72); u = (1,-1) - (.48,.72) = (.52,-1.72)
    # S2 += u k2^T = [[1.112,.416],[.168,-1.376]], o2 = S2 (0,2) = (.832,-2.752)
    o, s = gdn_recurrent_naive(q, k, v, g, beta, scale=1.0, use_qk_l2norm=False)
    torch.testing.assert_close(o[:, 0], torch.tensor([[1.0, 1.5], [0.832, -2.752]]))
    torch.testing.assert_close(s[0], torch.tensor([[1.112, 0.416], [0.168, -1.376]]))
    # the L2 norm comes first, then the scale: k2 = (3,4) -> (.6,.8); q2 = (0,7) -> (0,1), times scale 2 -> (0,2)
    o1, s1 = gdn_recurrent_naive(q[:1], k[:1], v[:1], g[:1], beta[:1], scale=1.0, use_qk_l2norm=False)
    o2, s2 = gdn_recurrent_naive(q[1:] * torch.tensor([1.0, 3.5]), k[1:] * 5, v[1:], g[1:], beta[1:], s1, scale=2.0)
    torch.testing.assert_close(o2[0, 0], torch.tensor([0.832, -2.752]), atol=2e-6, rtol=0)
    torch.testing.assert_close(s2, s, atol=2e-6, rtol=0)
    # one token from a given state: S0 = [[1,2],[0,1]], exp(g) = .5, k=(1,0), v=(1,1), beta=1, q=(1,0)
    # .5 S0 = [[.5,1],[0,.5]], S k = (.5,0), u = (.5,1), S1 = [[1,1],[1,.5]], o = (1,1)
    o, s = gdn_recurrent_naive(torch.tensor([[[1.0, 0.0]]]), torch.tensor([[[1.0, 0.0]]]), torch.ones(1, 1, 2),
                               torch.tensor([[math.log(0.5)]]), torch.ones(1, 1),
                               torch.tensor([[[1.0, 2.0], [0.0, 1.0]]]), scale=1.0)
    torch.testing.assert_close(o[0, 0], torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(s[0], torch.tensor([[1.0, 1.0], [1.0, 0.5]]))


def test_step_matches_matrix_form_and_gates():
    """S_t = exp(g) S (I - beta k k^T) + beta v k^T, o = S_t q on random values; gates by hand; GQA head map."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 5, generator=gen), torch.randn(1, 1, 5, generator=gen)
    v, s0 = torch.randn(1, 2, 3, generator=gen), torch.randn(2, 3, 5, generator=gen)
    g, beta = torch.tensor([[-0.3, -1.2]]), torch.tensor([[0.7, 0.2]])
    o, s = gdn_recurrent_naive(q, k, v, g, beta, s0)  # 1 k head, 2 v heads: both read k head 0
    qn, kn = F.normalize(q[0, 0], dim=0) * 5 ** -0.5, F.normalize(k[0, 0], dim=0)
    for h in range(2):
        want = g[0, h].exp() * s0[h] @ (torch.eye(5) - beta[0, h] * torch.outer(kn, kn)) + beta[0, h] * torch.outer(
            v[0, h], kn)
        torch.testing.assert_close(s[h], want, **F32)
        torch.testing.assert_close(o[0, h], want @ qn, **F32)
    p = GDNParams(random_gdn_params(1, 2, 4, 4).conv_weight, torch.tensor([math.log(2.0), 0.0]), torch.zeros(2),
                  1, 2, 4, 4)
    g, beta = gdn_gates(torch.tensor([[0.0, 30.0]]), torch.tensor([[0.0, 2.0]]), p)
    torch.testing.assert_close(g, torch.tensor([[-2 * math.log(2.0), -30.0]]))  # softplus(30) = 30 (threshold)
    torch.testing.assert_close(beta, torch.tensor([[0.5, 1 / (1 + math.exp(-2))]]))


def test_conv1d_hand_case():
    w = torch.tensor([[1.0, 10.0, 100.0]])  # oldest tap first, the current token last
    x = torch.tensor([[1.0], [2.0], [3.0]])
    y, win = causal_conv1d_naive(x, w, initial_window=torch.tensor([[5.0, 6.0]]), activation=None)
    torch.testing.assert_close(y[:, 0], torch.tensor([165.0, 216.0, 321.0]))  # 5+60+100, 6+10+200, 1+20+300
    torch.testing.assert_close(win, torch.tensor([[2.0, 3.0]]))
    y, win = causal_conv1d_naive(x[:1], w, torch.tensor([0.5]), torch.tensor([[5.0, 6.0]]))
    torch.testing.assert_close(y[0, 0], F.silu(torch.tensor(165.5)))
    torch.testing.assert_close(win, torch.tensor([[6.0, 1.0]]))  # T < W-1: reaches into the initial window


def test_split_invariance_and_chunked_form():
    """Running [0, s) then [s, T) with the state (and conv window) carried equals one run; the chunked form
    equals the token loop and its boundary states are the token loop's states after j * C tokens."""
    gen = torch.Generator().manual_seed(1)
    t, h, hv, dk, dv = 23, 1, 2, 8, 16
    q, k = torch.randn(t, h, dk, generator=gen), torch.randn(t, h, dk, generator=gen)
    v = torch.randn(t, hv, dv, generator=gen)
    g, beta = -torch.rand(t, hv, generator=gen), torch.rand(t, hv, generator=gen)
    s0 = torch.randn(hv, dv, dk, generator=gen) * 0.3
    o, s = gdn_recurrent_naive(q, k, v, g, beta, s0)
    for cut in (0, 1, 7, 22, 23):
        o1, s1 = gdn_recurrent_naive(q[:cut], k[:cut], v[:cut], g[:cut], beta[:cut], s0)
        o2, s2 = gdn_recurrent_naive(q[cut:], k[cut:], v[cut:], g[cut:], beta[cut:], s1)
        _close(torch.cat([o1, o2]), o)
        _close(s2, s)
    for c in (1, 4, 8, 64):
        oc, sc, bounds = gdn_chunk(q, k, v, g, beta, s0, chunk_size=c)
        _close(oc, o)
        _close(sc, s)
        assert bounds.shape[0] == t // c + 1
        for j in range(bounds.shape[0]):
            _close(bounds[j], gdn_recurrent_naive(q[:j * c], k[:j * c], v[:j * c], g[:j * c], beta[:j * c], s0)[1])
    case = make_gdn_case(2, 1, 2, 8, 8, 0, "chain")
    p, x, a, b = case.params, case.x, case.a, case.b
    full = gdn_layer_naive(x, a, b, p, case.state, case.window)
    first = gdn_layer_naive(x[:3], a[:3], b[:3], p, case.state, case.window)
    rest = gdn_layer_naive(x[3:], a[3:], b[3:], p, first.final_state, first.final_window)
    _close(torch.cat([first.output, rest.output]), full.output)
    _close(rest.final_state, full.final_state)
    _close(rest.final_window, full.final_window)


# (seed, H, HV, Dk, Dv, chunk, prefix, shape); every case runs fp32 and bf16
GRID = [
    (0, 1, 1, 8, 8, 4, 0, "chain"), (1, 1, 2, 8, 16, 8, 0, "fanout"), (2, 2, 2, 16, 8, 4, 0, "mixed"),
    (3, 1, 1, 16, 16, 8, 3, "chain"), (4, 1, 2, 16, 8, 4, 3, "fanout"), (5, 2, 2, 8, 16, 8, 5, "mixed"),
    (6, 1, 2, 8, 8, 4, 21, "chain"), (7, 2, 2, 16, 16, 8, 19, "fanout"), (8, 1, 2, 8, 16, 4, 22, "mixed"),
    (9, 2, 2, 8, 8, 8, 24, "mixed"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed,h,hv,dk,dv,chunk,p,shape", GRID)
def test_replay_matches_naive(seed, h, hv, dk, dv, chunk, p, shape, dtype):
    case = make_gdn_case(seed, h, hv, dk, dv, p, shape, chunk, dtype)
    ref = gdn_tree_naive(*case.args())
    got = gdn_tree_replay(*case.args(), chunk_size=chunk)
    assert got.output.dtype == dtype and got.output.shape == (p + case.layout.num_nodes, hv, dv)
    _close(got.output, ref.output, dtype)
    _close(got.final_state, ref.final_state, dtype)
    torch.testing.assert_close(got.final_window, ref.final_window, atol=0, rtol=0)


def test_prefix_checkpoints_and_the_state_matters():
    """Boundary states / windows and anchor states equal runs of prefix[:j C] / prefix[:a + 1]; node outputs
    change with the initial state and with an early prefix token (the state carries)."""
    case = make_gdn_case(11, 1, 2, 8, 8, 21, "mixed", chunk=4)
    x, a, b, p = case.x, case.a, case.b, case.params
    prep = replay_prefix(*case.args(), chunk_size=4)
    for j in range(prep.boundary_states.shape[0]):
        want = gdn_layer_naive(x[:4 * j], a[:4 * j], b[:4 * j], p, case.state, case.window)
        _close(prep.boundary_states[j], want.final_state)
        torch.testing.assert_close(prep.boundary_windows[j], want.final_window, atol=0, rtol=0)
    for slot, anchor in enumerate(case.layout.anchors.tolist()):
        want = gdn_layer_naive(x[:anchor + 1], a[:anchor + 1], b[:anchor + 1], p, case.state, case.window)
        _close(prep.anchor_states[slot], want.final_state)
    base = gdn_tree_replay(*case.args()).output[21:]
    other = gdn_tree_replay(x, a, b, p, case.layout, case.state * 2, case.window).output[21:]
    x2 = x.clone()
    x2[1] += 1.0
    moved = gdn_tree_replay(x2, a, b, p, case.layout, case.state, case.window).output[21:]
    assert (base - other).abs().max() > 1e-3 and (base - moved).abs().max() > 1e-3


def test_layout_from_tree_layout_conv_index_and_walk():
    tl_ = build_tree_layout(6, [2, 5], [[-1, 0, 0, 2], [-1, -1]])
    packed = pack_proposal_tree(list(range(6)), [2, 5], [[0] * 4, [0] * 2], [[-1, 0, 0, 2], [-1, -1]])
    lay = gdn_layout_from_tree_layout(tl_)
    assert lay.node_parent.tolist() == packed.node_parent.tolist() == [-1, 0, 0, 2, -1, -1]
    assert lay.node_anchor.tolist() == [2, 2, 2, 2, 5, 5] and lay.node_depth.tolist() == [0, 1, 1, 2, 0, 0]
    # width 4: ext index = row + 3; node 3 (row 9) window: anchor 2, node 0, node 2, itself
    idx = lay.conv_index(4)
    assert idx[0].tolist() == [0, 1, 2, 3] and idx[5].tolist() == [5, 6, 7, 8]
    assert idx[9].tolist() == [2 + 3, 6 + 3, 8 + 3, 9 + 3] and idx[10].tolist() == [3 + 3, 4 + 3, 5 + 3, 10 + 3]
    w = lay.walk()  # subtrees {0,1,2,3}, {4}, {5}; node 0 has a child (2) that is not next: saved, reloaded
    assert w.unit_ptr.tolist() == [0, 4, 5, 6] and w.unit_anchor.tolist() == [0, 1, 1]
    assert w.walk_load.tolist() == [-1, -1, 0, -1, -1, -1] and w.walk_save.tolist() == [0, -1, -1, -1, -1, -1]
    with pytest.raises(ValueError, match="out of range"):
        build_gdn_tree_layout(3, [3], [-1])
    with pytest.raises(ValueError, match="different anchors"):
        build_gdn_tree_layout(3, [0, 1], [-1, 0])
    with pytest.raises(ValueError, match="forward reference"):
        build_gdn_tree_layout(3, [0, 0], [1, -1])
    case = make_gdn_case(0, 1, 1, 8, 8, 3, "chain")
    with pytest.raises(ValueError, match="mixed_qkv must be"):
        gdn_tree_replay(case.x[1:], case.a[1:], case.b[1:], case.params, case.layout)
    with pytest.raises(ValueError, match="chunk_size"):
        gdn_tree_replay(*case.args(), chunk_size=0)
    with pytest.raises(ValueError, match="multiple"):
        random_gdn_params(2, 3, 8, 8)


TRITON_GRID = [  # (seed, H, HV, Dk, Dv, chunk, prefix, shape, dtype)
    (0, 1, 1, 8, 8, 4, 0, "fanout", torch.float32), (1, 1, 2, 16, 8, 8, 5, "chain", torch.float32),
    (2, 2, 2, 8, 16, 4, 21, "mixed", torch.float32), (3, 1, 2, 16, 16, 8, 13, "fanout", torch.bfloat16),
    (4, 2, 2, 8, 8, 4, 9, "mixed", torch.bfloat16),
]


@pytest.mark.skipif(tri.triton is None, reason="needs triton")
@pytest.mark.parametrize("seed,h,hv,dk,dv,chunk,p,shape,dtype", TRITON_GRID)
def test_triton_matches_replay(seed, h, hv, dk, dv, chunk, p, shape, dtype):
    case = make_gdn_case(seed, h, hv, dk, dv, p, shape, chunk, dtype)
    args = _on_device(case)
    want = gdn_tree_replay(*args, chunk_size=chunk)
    got = tri.gdn_tree_replay_triton(*args, chunk_size=chunk)
    assert got.output.dtype == dtype
    _close(got.output.cpu(), want.output.cpu(), dtype)
    if dtype == torch.float32:
        _close(got.output.cpu(), gdn_tree_naive(*case.args()).output)


@pytest.mark.skipif(tri.triton is None, reason="needs triton")
def test_triton_errors(monkeypatch):
    case = make_gdn_case(1, 1, 1, 8, 8, 3, "chain")
    prep = replay_prefix(*_on_device(case))
    rows = (prep.q[3:], prep.k[3:], prep.v[3:], prep.g[3:], prep.beta[3:], prep.anchor_states, case.layout, 0.3)
    with pytest.raises(TypeError, match="fp32/bf16/fp16"):
        tri.gdn_tree_nodes_triton(*rows[:2], rows[2].double(), *rows[3:])
    with pytest.raises(ValueError, match="do not match"):
        tri.gdn_tree_nodes_triton(rows[0][1:], *rows[1:])
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            tri.gdn_tree_nodes_triton(*rows)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tri, "triton", None)
    with pytest.raises(RuntimeError, match="needs triton"):
        tri.gdn_tree_replay_triton(*case.args())


@pytest.mark.skipif(tri.triton is None, reason="needs triton")
def test_kernel_compiles_for_cuda_sm90(monkeypatch):
    """No GPU needed: the non-interpreted kernel lowers to a cubin for an H100/H200 (Qwen3-Next head dims)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fn = tri._kernel()
    assert type(fn).__name__ == "JITFunction"
    ints = ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_gt", "stride_ot",
            "stride_oh", "STATE_STRIDE", "REP", "DK", "DV")
    sig = dict(Q="*bf16", K="*bf16", V="*bf16", G="*fp32", BETA="*fp32", O="*bf16", S0="*fp32", SCRATCH="*fp32",
               **{n: "*i32" for n in ("UNIT_PTR", "UNIT_ANCHOR", "WALK_NODE", "WALK_LOAD", "WALK_SAVE")},
               **{n: "i32" for n in ints}, scale="fp32", BK="constexpr", BV="constexpr", L2NORM="constexpr")
    k = triton_compile(ASTSource(fn=fn, signature=sig, constexprs={"BK": 128, "BV": 32, "L2NORM": True}),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert len(k.asm["cubin"]) > 0
    assert "scf.for" in k.asm["ttir"] and "scf.if" in k.asm["ttir"]  # the node walk, the scratch reload / store


def test_random_tree_shapes_fp32():
    """A few random layouts (any parents, anchors incl. -1) through replay vs naive, fp32, chunk 4."""
    rng = random.Random(5)
    for seed in range(3):
        case = make_gdn_case(seed + 20, 1, 2, 8, 8, rng.randint(1, 14), "mixed", chunk=4)
        _close(gdn_tree_replay(*case.args(), chunk_size=4).output, gdn_tree_naive(*case.args()).output)
