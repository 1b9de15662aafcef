"""Tree-attention backend registry: which implementation runs a packed row's tree attention on a device.

Every backend has the signature of :func:`specopd_kernels.tree.tree_attention_grouped`
``(q, k, v, layout, scale=None, prefix_kv=None) -> out``:
  - ``torch``: :func:`tree_attention_grouped`, plain torch, exact, differentiable; any device. The default on CPU.
  - ``triton``: :func:`specopd_kernels.tree.triton_attention.tree_attention_triton`, one fused flash-attention
    kernel, forward only. The default on CUDA when triton imports. UNVERIFIED ON A GPU: parity is tested
    under the Triton interpreter only; run ``benchmarks/kernels_gpu.py`` on a GPU before relying on it, or force
    ``SPECOPD_TREE_ATTENTION=torch``.
  - ``flashinfer``: :func:`specopd_kernels.tree.flashinfer_attention.tree_attention_flashinfer`, FlashInfer's
    prefill kernel with the row's packed custom mask, forward only; CUDA with flashinfer installed, chosen only
    by ``SPECOPD_TREE_ATTENTION=flashinfer``. UNVERIFIED ON A GPU (tested on CPU with a torch stand-in for the
    FlashInfer call).
:func:`get_tree_attention` picks one per device (the env variable ``SPECOPD_TREE_ATTENTION`` = ``torch`` /
``triton`` / ``flashinfer`` overrides the choice); the score_trees forward calls through it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

from .flashinfer_attention import flashinfer_runs_on, tree_attention_flashinfer
from .grouped import tree_attention_grouped
from .triton_attention import tree_attention_triton, triton_runs_on

__all__ = ["TreeAttentionBackend", "TREE_ATTENTION_BACKENDS", "choose_backend", "get_tree_attention",
           "tree_attention_backend_name"]

ENV_VAR = "SPECOPD_TREE_ATTENTION"


@dataclass(frozen=True)
class TreeAttentionBackend:
    """One tree-attention implementation.

    name: registry key. fn: the attention function (signature of :func:`tree_attention_grouped`).
    runs_on: ``runs_on(device) -> bool``, whether fn can run tensors of that device here.
    differentiable: whether fn has a backward. verified: whether its values were checked on the hardware it is
    the default for (False = interpreter-tested only).
    """

    name: str
    fn: Callable
    runs_on: Callable[[torch.device], bool]
    differentiable: bool
    verified: bool


TREE_ATTENTION_BACKENDS: Dict[str, TreeAttentionBackend] = {
    "torch": TreeAttentionBackend("torch", tree_attention_grouped, lambda device: True, True, True),
    "triton": TreeAttentionBackend("triton", tree_attention_triton, triton_runs_on, False, False),
    "flashinfer": TreeAttentionBackend("flashinfer", tree_attention_flashinfer, flashinfer_runs_on, False, False),
}


def choose_backend(device, name: Optional[str], env_var: str, runs_on: Dict[str, Callable[[torch.device], bool]],
                   what: str) -> str:
    """A kernel backend for ``device`` out of ``runs_on`` (backend name -> ``runs_on(device) -> bool``, with
    ``torch`` and ``triton`` among them): ``name`` if given, else the env variable ``env_var`` if set, else
    ``triton`` on CUDA when it can run there, else ``torch``. ``what`` names the op in errors.
    Raises ValueError on an unknown name or a backend that cannot run on ``device``."""
    dev = torch.device(device)
    chosen = name or os.environ.get(env_var) or None
    if chosen is None:
        return "triton" if dev.type == "cuda" and runs_on["triton"](dev) else "torch"
    if chosen not in runs_on:
        raise ValueError(f"unknown {what} backend {chosen!r} (from {'argument' if name else env_var}); "
                         f"known: {', '.join(runs_on)}")
    if not runs_on[chosen](dev):
        raise ValueError(f"{what} backend {chosen!r} cannot run on {dev.type} here "
                         "(triton needs CUDA, or TRITON_INTERPRET=1 on CPU; flashinfer needs CUDA and flashinfer)")
    return chosen


def tree_attention_backend_name(device, name: Optional[str] = None) -> str:
    """The backend :func:`get_tree_attention` picks for ``device``: ``name`` if given, else the env variable
    ``SPECOPD_TREE_ATTENTION`` if set, else ``triton`` on CUDA when triton imports, else ``torch``.
    Raises ValueError on an unknown name or a backend that cannot run on ``device``."""
    return choose_backend(device, name, ENV_VAR, {k: b.runs_on for k, b in TREE_ATTENTION_BACKENDS.items()},
                          "tree-attention")


def get_tree_attention(device, name: Optional[str] = None) -> Callable:
    """The tree-attention function for tensors on ``device`` (see :func:`tree_attention_backend_name`).

    Returns a callable ``(q, k, v, layout, scale=None, prefix_kv=None) -> out`` with the contract of
    :func:`specopd_kernels.tree.tree_attention_grouped`. The CUDA default (Triton) is forward only and
    unverified on a GPU. Raises ValueError on an unknown or unusable backend name."""
    return TREE_ATTENTION_BACKENDS[tree_attention_backend_name(device, name)].fn
