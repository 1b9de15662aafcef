"""The kernel each op runs on a device, in one line (what the server logs once at start): tree attention, QSA
sparse attention, GDN state replay and the E2E-TV alpha, each chosen by :func:`specopd_kernels.verified.choose`."""

from __future__ import annotations

from .gdn.backends import GDN_REPLAY_BACKENDS
from .losses.fused import triton_available
from .sparse.attention import SPARSE_ATTENTION_BACKENDS
from .tree.backends import TREE_ATTENTION_BACKENDS
from .verified import describe_choices

__all__ = ["kernel_choices"]


def kernel_choices(device) -> str:
    """``"cuda: tree_attention=torch (default verified: tree_attention_triton: no GPU record; ...), ..."``: every op's
    backend on ``device`` and why (a variable's value is shown as an error instead of raising)."""
    runs_on = {
        "tree_attention": {k: b.runs_on for k, b in TREE_ATTENTION_BACKENDS.items()},
        "sparse_attention": {k: b[1] for k, b in SPARSE_ATTENTION_BACKENDS.items()},
        "gdn_replay": {k: b[1] for k, b in GDN_REPLAY_BACKENDS.items()},
        "e2e_tv": {"torch": lambda d: True, "triton": lambda d: d.type == "cuda" and triton_available()},
    }
    return describe_choices(device, runs_on)
