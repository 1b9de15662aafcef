"""Triton tree-attention kernel vs the plain-torch references (dense mask / grouped), under the Triton
interpreter on CPU (the module fixture sets TRITON_INTERPRET=1 before the kernel is built; on a CUDA machine the
compiled kernel runs instead). Grid: GQA ratios, head dims 64 / 128, fp32 / bf16, full rows and cached prefixes,
prefix 0..8k (few large cases: the interpreter is slow), trees up to 32 anchors x 16 branches x block 16."""

import random

import pytest
import torch

from _tree_attention_cases import chain_parents, make_case, random_case
from support.triton import triton_interpret  # noqa: F401  (module fixture: TRITON_INTERPRET=1 on CPU)
from specopd_kernels.tree import build_tree_layout, tree_attention_grouped, tree_attention_reference
from specopd_kernels.tree import triton_attention as tri

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

pytestmark = pytest.mark.skipif(not tri.triton_available(), reason="needs triton")


def _run(case, cached, device=DEVICE):
    p = case.layout.prefix_len
    layout = case.layout.to(device)
    q, k, v = (x.to(device) for x in (case.q, case.k, case.v))
    if cached:
        return tri.tree_attention_triton(q[p:], k[p:], v[p:], layout, prefix_kv=(k[:p], v[:p])).cpu()
    return tri.tree_attention_triton(q, k, v, layout).cpu()


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


GRID = [  # (seed, prefix, trees, max nodes, hq, hkv, head dim, dtype, cached)
    (0, 1, 1, 1, 4, 4, 64, torch.float32, False),
    (1, 9, 3, 6, 6, 2, 64, torch.float32, True),
    (2, 23, 4, 20, 8, 1, 128, torch.float32, False),
    (3, 40, 2, 9, 4, 2, 128, torch.bfloat16, True),
    (4, 17, 5, 5, 6, 3, 64, torch.bfloat16, False),
    (5, 150, 3, 40, 2, 1, 64, torch.float32, False),  # several prefix key tiles and two tree tiles of 64
    (6, 130, 2, 70, 4, 2, 128, torch.float32, True),
    (12, 60, 6, 16, 8, 2, 64, torch.bfloat16, False),
    (13, 300, 8, 15, 9, 3, 64, torch.float32, True),  # SmolLM2 attention dims
]


@pytest.mark.parametrize("seed,p,trees,max_nodes,hq,hkv,d,dtype,cached", GRID)
def test_triton_matches_dense_reference(seed, p, trees, max_nodes, hq, hkv, d, dtype, cached):
    case = random_case(seed, p, trees, max_nodes, hq, hkv, d, dtype)
    ref = tree_attention_reference(*(x.float() for x in (case.q, case.k, case.v)), case.mask)
    got = _run(case, cached)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), ref[p:] if cached else ref, **_tol(dtype))


def test_triton_prefix_only_empty_and_scale():
    """No trees (causal prefix rows only), an empty row (prefix 0), a cached prefix with no nodes, and an
    explicit softmax scale."""
    case = make_case(70, [], [], 4, 2, 64, seed=3)
    torch.testing.assert_close(_run(case, False), tree_attention_reference(case.q, case.k, case.v, case.mask),
                               atol=1e-5, rtol=1e-5)
    assert _run(case, True).shape == (0, 4, 64)
    empty = make_case(0, [], [], 4, 2, 64, with_mask=False)
    assert _run(empty, False).shape == (0, 4, 64)
    case = random_case(7, 30, 3, 6, 4, 2, 64)
    got = tri.tree_attention_triton(case.q, case.k, case.v, case.layout, scale=0.3)
    torch.testing.assert_close(got, tree_attention_reference(case.q, case.k, case.v, case.mask, scale=0.3),
                               atol=1e-5, rtol=1e-5)


def test_triton_large_prefixes_against_grouped():
    """8k cached prefix (anchors near both ends) and a 1k full row, against the grouped torch path."""
    case = make_case(8192, [8100, 3000, 0], [[-1, 0, 1, -1], [-1], [-1, 0]], 2, 1, 128, seed=8, with_mask=False)
    p = 8192
    ref = tree_attention_grouped(case.q, case.k, case.v, case.layout)[p:]
    torch.testing.assert_close(_run(case, True), ref, atol=1e-5, rtol=1e-5)
    case = make_case(1024, [1000, 77], [chain_parents(2, 3), [-1]], 2, 1, 64, seed=9, with_mask=False)
    torch.testing.assert_close(_run(case, False), tree_attention_grouped(case.q, case.k, case.v, case.layout),
                               atol=1e-5, rtol=1e-5)


def test_triton_32_anchors_16_branches_block_16():
    """The largest tree shape: 32 anchors x 16 branches x 15 drafted tokens (block 16) = 7,680 nodes."""
    rng = random.Random(10)
    anchors = sorted(rng.randrange(96) for _ in range(32))
    case = make_case(96, anchors, [chain_parents(16, 15)] * 32, 2, 1, 64, seed=10, with_mask=False)
    ref = tree_attention_grouped(case.q, case.k, case.v, case.layout)[96:]
    torch.testing.assert_close(_run(case, True), ref, atol=1e-5, rtol=1e-5)


def test_triton_errors(monkeypatch):
    case = random_case(11, 12, 2, 4, 4, 2, 64)
    with pytest.raises(ValueError, match="forward only"):
        tri.tree_attention_triton(case.q.requires_grad_(), case.k, case.v, case.layout)
    with torch.no_grad():  # fine without autograd
        tri.tree_attention_triton(case.q, case.k, case.v, case.layout)
    case.q.requires_grad_(False)
    with pytest.raises(TypeError, match="fp32/bf16/fp16"):
        tri.tree_attention_triton(case.q.double(), case.k, case.v, case.layout)
    with pytest.raises(ValueError, match="layout expects"):
        tri.tree_attention_triton(case.q[1:], case.k[1:], case.v[1:], case.layout)
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            tri.tree_attention_triton(case.q, case.k, case.v, case.layout)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tri, "triton", None)
    with pytest.raises(RuntimeError, match="needs triton"):
        tri.tree_attention_triton(case.q, case.k, case.v, case.layout)


def test_triton_tables_are_cached_per_layout():
    layout = build_tree_layout(10, [3, 9], [[-1, 0], [-1]])
    q = torch.randn(13, 2, 64)
    tri.tree_attention_triton(q, q[:, :1], q[:, :1], layout)
    keys = [k for k in layout.cache if k[0] == "triton"]
    assert len(keys) == 1
    pre, tree = layout.cache[keys[0]][:2]
    assert pre.tolist() == [[-1, 0]] and tree.tolist() == [[0, 0], [1, 0]]


@pytest.mark.parametrize("dtype,d,block_m,warps", [("fp32", 64, 16, 4), ("bf16", 128, 64, 8)])
def test_kernel_compiles_for_cuda_sm90(monkeypatch, dtype, d, block_m, warps):
    """No GPU needed: the non-interpreted kernel lowers all the way to a cubin for an H100/H200 (4 dots, 4
    reductions: two online-softmax loops)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fn = tri._kernel()
    assert type(fn).__name__ == "JITFunction"
    ptr = f"*{dtype}"
    ints = ("stride_qt", "stride_qh", "stride_kpt", "stride_kph", "stride_vpt", "stride_vph", "stride_knt",
            "stride_knh", "stride_vnt", "stride_vnh", "stride_ot", "stride_oh", "P", "M", "QBASE", "REP", "HEAD_DIM")
    sig = dict(Q=ptr, KP=ptr, VP=ptr, KN=ptr, VN=ptr, O=ptr, TILES="*i32", GROUP_NODES="*i64", GROUP_ANCHOR="*i64",
               GROUP_SIZE="*i32", GROUP_ANC="*i8", **{n: "i32" for n in ints}, qk_scale="fp32",
               **{n: "constexpr" for n in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "PRECISION", "DOT_F32")})
    consts = {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_D": d, "PRECISION": "ieee" if dtype == "fp32" else "tf32",
              "DOT_F32": False}
    k = triton_compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps})
    assert len(k.asm["cubin"]) > 0
    assert k.asm["ttir"].count("tt.dot") == 4 and k.asm["ttir"].count('"tt.reduce"') == 4
