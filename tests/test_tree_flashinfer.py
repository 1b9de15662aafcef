"""The FlashInfer tree-attention backend (``specopd_kernels.tree.flashinfer_attention``) on a CPU machine.

FlashInfer runs on CUDA only, so here: the row mask built from the layout equals the packing's own dense mask
(``ProposalTree.mask``, built independently), and the backend's call into FlashInfer is checked with
``flashinfer.single_prefill_with_kv_cache`` replaced by a torch stand-in that unpacks the mask the way FlashInfer
does (bit order "little", row-major [q_len, kv_len]) and runs masked attention: its output equals the grouped torch
path, with and without the prefix K/V from the cache. The stand-in's keyword arguments are checked against the
installed FlashInfer's signature, so a renamed argument fails here rather than on a GPU."""

from __future__ import annotations

import inspect
import math
import sys
import types

import pytest
import torch

from _tree_attention_cases import chain_parents, make_case, random_case
from specopd_kernels.tree import (TREE_ATTENTION_BACKENDS, tree_attention_backend_name, tree_attention_flashinfer,
                                  tree_attention_grouped, tree_row_mask, unpackbits)
from specopd_kernels.tree.backends import ENV_VAR

CALLS: list = []


def _fake_single_prefill(q, k, v, *, packed_custom_mask, sm_scale, kv_layout):
    """FlashInfer's single prefill with a packed custom mask, in torch (NHD, GQA by kv head = h // (Hq / Hkv))."""
    assert kv_layout == "NHD" and packed_custom_mask.dtype == torch.uint8
    qo, kv = q.shape[0], k.shape[0]
    mask = unpackbits(packed_custom_mask, qo * kv, bitorder="little").view(qo, kv)
    CALLS.append(mask)
    rep = q.shape[1] // k.shape[1]
    kf, vf = (x.float().repeat_interleave(rep, dim=1) for x in (k, v))
    s = torch.einsum("qhd,khd->hqk", q.float(), kf) * sm_scale
    s = s.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vf).to(q.dtype)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    CALLS.clear()
    mod = types.ModuleType("flashinfer")
    mod.single_prefill_with_kv_cache = _fake_single_prefill
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    return mod


@pytest.mark.parametrize("seed,p,trees,max_nodes", [(0, 9, 3, 6), (1, 40, 6, 10), (2, 1, 1, 3), (3, 17, 4, 0)])
def test_row_mask_equals_the_packings_dense_mask(seed, p, trees, max_nodes):
    case = random_case(seed, p, trees, max_nodes, hq=4, hkv=2, d=8)
    mask = tree_row_mask(case.layout)
    assert mask.dtype == torch.bool and torch.equal(mask, case.mask)
    assert torch.equal(tree_row_mask(case.layout, with_prefix_rows=False), case.mask[p:])


def test_row_mask_hand_case():
    # prefix of 3, one anchor at 1 with a chain of 2 nodes: node 0 sees prefix 0..1 and itself; node 1 also node 0
    case = make_case(3, [1], [[-1, 0]], hq=2, hkv=1, d=4)
    assert tree_row_mask(case.layout).int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                                                          [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 8), (6, 6, 16), (9, 3, 64)])
def test_backend_call_equals_grouped_torch(fake_flashinfer, cached, hq, hkv, d):
    case = make_case(24, [3, 10, 23], [chain_parents(2, 3), chain_parents(4, 2), [-1, 0, 0, 1]], hq, hkv, d, seed=hq)
    p, scale = 24, 1.0 / math.sqrt(d)
    if cached:
        args = (case.q[p:], case.k[p:], case.v[p:], case.layout)
        kw = {"prefix_kv": (case.k[:p], case.v[:p])}
    else:
        args, kw = (case.q, case.k, case.v, case.layout), {}
    out = tree_attention_flashinfer(*args, **kw)
    ref = tree_attention_grouped(*args, scale=scale, **kw)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert CALLS[-1].shape == ((0 if cached else p) + case.layout.num_nodes, p + case.layout.num_nodes)
    # the packed mask is built once per layout and reused by the next layer's call
    tree_attention_flashinfer(*args, **kw)
    assert len([k for k in case.layout.cache if k[0] == "flashinfer_mask"]) == 1


def test_stand_in_matches_installed_flashinfer_signature():
    try:
        from flashinfer import single_prefill_with_kv_cache
    except Exception as exc:  # not installed / not importable on this machine
        pytest.skip(f"flashinfer not importable: {exc}")
    params = inspect.signature(single_prefill_with_kv_cache).parameters
    for name in ("q", "k", "v", "packed_custom_mask", "sm_scale", "kv_layout"):
        assert name in params, name


def test_dispatch_needs_cuda_and_an_explicit_choice(monkeypatch, fake_flashinfer):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert TREE_ATTENTION_BACKENDS["flashinfer"].runs_on(torch.device("cpu")) is False
    assert TREE_ATTENTION_BACKENDS["flashinfer"].runs_on(torch.device("cuda")) is True  # importable (stand-in)
    assert tree_attention_backend_name("cuda") != "flashinfer"  # never the default
    monkeypatch.setenv(ENV_VAR, "flashinfer")
    assert tree_attention_backend_name("cuda") == "flashinfer"
    with pytest.raises(ValueError, match="cannot run on cpu"):
        tree_attention_backend_name("cpu")
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # not installed: refused on CUDA too
    with pytest.raises(ValueError, match="cannot run on cuda"):
        tree_attention_backend_name("cuda")
