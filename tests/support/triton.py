"""The Triton interpreter for kernel tests on CPU: a module that does ``from support.triton import
triton_interpret  # noqa: F401`` runs its Triton kernels with ``TRITON_INTERPRET=1`` when there is no GPU."""

from __future__ import annotations

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module", autouse=True)
def triton_interpret():
    """TRITON_INTERPRET=1 for the whole module on CPU (nothing on a GPU)."""
    with pytest.MonkeyPatch.context() as mp:
        if DEVICE == "cpu":
            mp.setenv("TRITON_INTERPRET", "1")
        yield
