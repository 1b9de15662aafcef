"""GDN indexed-state-replay backend per device: the torch replay (:func:`specopd_kernels.gdn.gdn_tree_replay`) or
the Triton tree kernel (:func:`specopd_kernels.gdn.gdn_tree_replay_triton`), chosen by
:func:`specopd_kernels.verified.choose` for op ``gdn_replay``: torch on CPU; on CUDA the Triton kernel only when the
GPU acceptance run verified it for its current source; ``SPECOPD_GDN_REPLAY`` = ``torch`` / ``triton`` /
``verified`` (or ``SPECOPD_KERNELS``, CUDA only) overrides."""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

from ..tree.triton_attention import triton_runs_on
from ..verified import choose
from .replay import gdn_tree_replay
from .triton_replay import gdn_tree_replay_triton

__all__ = ["GDN_REPLAY_BACKENDS", "gdn_replay_backend_name", "get_gdn_tree_replay"]

GDN_REPLAY_BACKENDS: Dict[str, tuple[Callable, Callable[[torch.device], bool]]] = {
    "torch": (gdn_tree_replay, lambda device: True),
    "triton": (gdn_tree_replay_triton, triton_runs_on),
}


def gdn_replay_backend_name(device, name: Optional[str] = None) -> str:
    """The backend :func:`get_gdn_tree_replay` picks for ``device`` (module docstring). Raises ValueError on an
    unknown name or a backend that cannot run on ``device``."""
    return choose("gdn_replay", device, {k: b[1] for k, b in GDN_REPLAY_BACKENDS.items()}, name=name).backend


def get_gdn_tree_replay(device, name: Optional[str] = None) -> Callable:
    """The replay function for tensors on ``device``, with the contract of :func:`gdn_tree_replay`."""
    return GDN_REPLAY_BACKENDS[gdn_replay_backend_name(device, name)][0]
