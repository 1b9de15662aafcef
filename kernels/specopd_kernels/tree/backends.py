"""Tree-attention backend registry: which implementation runs a packed row's tree attention on a device.

Every backend has the signature of :func:`specopd_kernels.tree.tree_attention_grouped`
``(q, k, v, layout, scale=None, prefix_kv=None) -> out``:
  - ``torch``: :func:`tree_attention_grouped`, plain torch, exact, differentiable; any device. The default on CPU,
    and on CUDA unless a kernel below is verified there.
  - ``triton``: :func:`specopd_kernels.tree.triton_attention.tree_attention_triton`, one fused flash-attention
    kernel, forward only; CUDA (or CPU under TRITON_INTERPRET=1, tests).
  - ``flashinfer``: :func:`specopd_kernels.tree.flashinfer_attention.tree_attention_flashinfer`, FlashInfer's
    prefill kernel with the row's packed custom mask, forward only; CUDA with flashinfer installed.
:func:`get_tree_attention` picks one per device through :func:`specopd_kernels.verified.choose`: on CUDA a kernel
only when the GPU acceptance run (``benchmarks/kernels_gpu/run.py``) verified it for its current source, else torch;
``SPECOPD_TREE_ATTENTION`` = ``torch`` / ``triton`` / ``flashinfer`` / ``verified`` (or ``SPECOPD_KERNELS``, CUDA
only) overrides the choice; the score_trees forward calls through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

from .flashinfer_attention import flashinfer_runs_on, tree_attention_flashinfer
from .grouped import tree_attention_grouped
from .triton_attention import tree_attention_triton, triton_runs_on
from ..verified import choose, is_verified

__all__ = ["TreeAttentionBackend", "TREE_ATTENTION_BACKENDS", "get_tree_attention", "tree_attention_backend_name"]

ENV_VAR = "SPECOPD_TREE_ATTENTION"


@dataclass(frozen=True)
class TreeAttentionBackend:
    """One tree-attention implementation.

    name: registry key. fn: the attention function (signature of :func:`tree_attention_grouped`).
    runs_on: ``runs_on(device) -> bool``, whether fn can run tensors of that device here.
    differentiable: whether fn has a backward. kernel: its id in :data:`specopd_kernels.verified.KERNELS` (None
    for the torch path, which needs no GPU record).
    """

    name: str
    fn: Callable
    runs_on: Callable[[torch.device], bool]
    differentiable: bool
    kernel: Optional[str] = None

    @property
    def verified(self) -> bool:
        """Whether this backend may run on CUDA by default: the torch path always; a kernel when its GPU record
        passed for its current source (:func:`specopd_kernels.verified.is_verified`)."""
        return self.kernel is None or is_verified(self.kernel)[0]


TREE_ATTENTION_BACKENDS: Dict[str, TreeAttentionBackend] = {
    "torch": TreeAttentionBackend("torch", tree_attention_grouped, lambda device: True, True),
    "triton": TreeAttentionBackend("triton", tree_attention_triton, triton_runs_on, False, "tree_attention_triton"),
    "flashinfer": TreeAttentionBackend("flashinfer", tree_attention_flashinfer, flashinfer_runs_on, False,
                                       "tree_attention_flashinfer"),
}


def tree_attention_backend_name(device, name: Optional[str] = None) -> str:
    """The backend :func:`get_tree_attention` picks for ``device`` (:func:`specopd_kernels.verified.choose` for op
    ``tree_attention``): ``name`` if given, else ``SPECOPD_TREE_ATTENTION``, else (CUDA) ``SPECOPD_KERNELS``, else
    a verified kernel on CUDA, else ``torch``. Raises ValueError on an unknown name or a backend that cannot run
    on ``device``."""
    return choose("tree_attention", device, {k: b.runs_on for k, b in TREE_ATTENTION_BACKENDS.items()},
                  name=name).backend


def get_tree_attention(device, name: Optional[str] = None) -> Callable:
    """The tree-attention function for tensors on ``device`` (see :func:`tree_attention_backend_name`).

    Returns a callable ``(q, k, v, layout, scale=None, prefix_kv=None) -> out`` with the contract of
    :func:`specopd_kernels.tree.tree_attention_grouped`. Raises ValueError on an unknown or unusable backend
    name."""
    return TREE_ATTENTION_BACKENDS[tree_attention_backend_name(device, name)].fn
