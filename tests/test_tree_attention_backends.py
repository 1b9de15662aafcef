"""Tree-attention backend dispatch (``specopd_kernels.tree.backends``): torch grouped on CPU, and on CUDA unless a
GPU record verified a kernel (``specopd_kernels.verified``; chosen here on a CPU machine: the choice needs no GPU),
the env override and its errors."""

import pytest
import torch

from _tree_attention_cases import random_case
from specopd_kernels.tree import (TREE_ATTENTION_BACKENDS, get_tree_attention, tree_attention_backend_name,
                                  tree_attention_grouped, tree_attention_triton)
from specopd_kernels.tree import triton_attention as tri
from specopd_kernels.tree.backends import ENV_VAR


@pytest.fixture(autouse=True)
def _no_override(monkeypatch, tmp_path):
    from specopd_kernels import verified

    for name in (ENV_VAR, "TRITON_INTERPRET", verified.GLOBAL_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(verified, "RECORDS_FILE", tmp_path / "none.json")  # no GPU record: nothing is verified


def test_defaults_per_device(monkeypatch):
    assert tree_attention_backend_name("cpu") == "torch"
    assert get_tree_attention(torch.device("cpu")) is tree_attention_grouped
    assert tree_attention_backend_name("cuda") == "torch"  # no GPU record: the kernel is not the default
    assert get_tree_attention("cuda") is tree_attention_grouped
    monkeypatch.setenv("SPECOPD_KERNELS", "triton")  # asked for (the CUDA-wide switch)
    if tri.triton_available():
        assert get_tree_attention("cuda") is tree_attention_triton
    assert tree_attention_backend_name("cpu") == "torch"  # the CUDA-wide switch leaves CPU alone


def test_registry_marks_the_gpu_paths_unverified_and_forward_only():
    assert set(TREE_ATTENTION_BACKENDS) == {"torch", "triton", "flashinfer"}
    f = TREE_ATTENTION_BACKENDS["flashinfer"]
    assert (f.verified, f.differentiable, f.kernel) == (False, False, "tree_attention_flashinfer")
    t, g = TREE_ATTENTION_BACKENDS["triton"], TREE_ATTENTION_BACKENDS["torch"]
    assert (t.verified, t.differentiable) == (False, False) and (g.verified, g.differentiable) == (True, True)


def test_override_and_errors(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "torch")
    assert tree_attention_backend_name("cuda") == "torch"
    monkeypatch.setenv(ENV_VAR, "flash")
    with pytest.raises(ValueError, match="unknown tree-attention backend 'flash'.*SPECOPD_TREE_ATTENTION"):
        get_tree_attention("cpu")
    with pytest.raises(ValueError, match="unknown tree-attention backend 'x' \\(from argument\\)"):
        get_tree_attention("cpu", "x")
    if not tri.triton_available():
        return
    monkeypatch.setenv(ENV_VAR, "triton")
    with pytest.raises(ValueError, match="cannot run on cpu"):
        get_tree_attention("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter runs the Triton backend on CPU
    fn = get_tree_attention("cpu")
    assert fn is tree_attention_triton
    case = random_case(0, 20, 3, 6, 4, 2, 64)
    torch.testing.assert_close(fn(case.q, case.k, case.v, case.layout),
                               tree_attention_grouped(case.q, case.k, case.v, case.layout), atol=1e-5, rtol=1e-5)
