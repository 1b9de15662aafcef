"""Data parallelism of the training loops under ``torchrun``: DDP (replicas) or FSDP2 (sharded), one API.

``parallel: ddp`` wraps a loop's loss module in :class:`torch.nn.parallel.DistributedDataParallel`: every rank
holds the whole drafter and its AdamW state, gradients are all-reduced. ``parallel: fsdp2`` applies
:func:`torch.distributed.fsdp.fully_shard` to the loss module (the drafter inside it is ONE FSDP unit: the drafters
call their layers' methods, not their ``forward``, so the layers cannot be separate units): each rank keeps
``1/world`` of every parameter, its gradient and its AdamW moments as DTensor shards; the module's ``forward``
all-gathers the parameters, its backward reduce-scatters the gradients (averaged over ranks). The process group is
gloo without CUDA, and gloo for CPU tensors + nccl for CUDA tensors when CUDA is available (:func:`backend`); the
FSDP2 device mesh is on the device the drafter's parameters are on, so the collectives follow the training device.

Checkpoints stay in the single-process format whatever the strategy: :func:`full_training_state` gathers the full
drafter state dict and the optimizer state dict keyed by parameter index (``torch.optim.Optimizer.state_dict``'s
form) on rank 0, :func:`load_training_state` scatters such a checkpoint back into shards, so a run written by FSDP2
resumes in one process and vice versa. At the end of a sharded run :func:`materialize` turns the drafter's
parameters back into plain full tensors on every rank (for the final push and ``save_pretrained``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Tuple

import torch

STRATEGIES = ("ddp", "fsdp2")


def backend() -> str:
    """The torch.distributed backend of this machine: ``"gloo"`` without CUDA, else ``"cpu:gloo,cuda:nccl"`` (one
    process group: CPU tensors over gloo, CUDA tensors over nccl; object collectives over gloo), so that a drafter
    trained on the CPU or on a GPU has its collectives either way."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def wrap(module: torch.nn.Module, strategy: str, world: int, **ddp_kwargs) -> torch.nn.Module:
    """``module`` ready for ``world`` ranks: itself when ``world == 1``, DDP-wrapped (``ddp_kwargs`` passed on) for
    ``"ddp"``, or sharded in place by FSDP2 (``fully_shard`` on a 1-D device mesh of all ranks; returned) for
    ``"fsdp2"`` (the mesh on the device of the module's parameters: ``cpu``, or ``cuda`` with each rank's module
    already on its own GPU). Build the optimizer AFTER this call (FSDP2 replaces the parameters by DTensor shards). Under FSDP2
    every rank must call the module's ``forward`` and ``backward`` the same number of times per step.

    Raises ValueError for an unknown ``strategy``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown parallel strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    if world <= 1:
        return module
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(module, **ddp_kwargs)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(module.parameters()).device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    fully_shard(module, mesh=init_device_mesh(device.type, (world,)))
    return module


def is_sharded(module: torch.nn.Module) -> bool:
    """True when ``module`` (e.g. the drafter inside a loss module given to :func:`wrap`) holds FSDP2 shards
    (DTensor parameters)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def _trainable_names(drafter: torch.nn.Module) -> List[str]:
    """Names of the trainable parameters in ``drafter.parameters()`` order: the engine's optimizer order."""
    return [n for n, p in drafter.named_parameters() if p.requires_grad]


def full_training_state(drafter: torch.nn.Module, opt: torch.optim.Optimizer) -> Tuple[Dict[str, Any], Dict]:
    """(drafter state dict, optimizer state dict) in the single-process form: full CPU tensors (the drafter's
    ``state_dict`` keys), the optimizer's state and param groups keyed by parameter index.

    Single process / DDP: ``drafter.state_dict()`` and ``opt.state_dict()``. FSDP2: COLLECTIVE (every rank must
    call it); rank 0 gets the gathered dicts, the other ranks empty ones.
    """
    if not is_sharded(drafter):
        return drafter.state_dict(), opt.state_dict()
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model = get_model_state_dict(drafter, options=options)
    named = get_optimizer_state_dict(drafter, opt, options=options)
    if dist.get_rank() != 0:
        return {}, {}
    index = {n: i for i, n in enumerate(_trainable_names(drafter))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]]
    return model, {"state": {index[n]: s for n, s in named["state"].items()}, "param_groups": groups}


def load_training_state(drafter: torch.nn.Module, opt: torch.optim.Optimizer, model: Dict[str, torch.Tensor],
                        optim: Dict) -> None:
    """Load a checkpoint's full drafter / optimizer state dicts (:func:`full_training_state`'s form, as every rank
    reads them from the file) into a plain or FSDP2-sharded drafter and its optimizer (each rank keeps its shard).

    Raises RuntimeError / KeyError when the state does not fit the drafter (other architecture or sizes).
    """
    if not is_sharded(drafter):
        drafter.load_state_dict(model)
        opt.load_state_dict(optim)
        return
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(drafter, model, options=options)
    names = _trainable_names(drafter)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in optim["param_groups"]]
    named = {"state": {names[int(i)]: s for i, s in optim["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(drafter, opt, named, options=options)


def grad_norm_value(norm: torch.Tensor) -> float:
    """``clip_grad_norm_``'s total norm as a float (a DTensor norm of sharded gradients is made full first)."""
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)


@contextlib.contextmanager
def unsharded(module: torch.nn.Module) -> Iterator[None]:
    """Inside the block the drafter inside FSDP2-sharded ``module`` holds full plain parameters (for a no-grad
    evaluation outside ``forward``); a no-op for unsharded modules. COLLECTIVE under FSDP2: every rank enters."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


class FullDrafter:
    """A stand-in for an FSDP2-sharded drafter at a push: ``checkpoint_tensors`` / ``state_dict`` /
    ``save_pretrained`` from gathered full tensors, every other attribute (``spec``, ``checkpoint_config``, ...)
    the drafter's own. Built by :func:`pushable`."""

    def __init__(self, drafter: torch.nn.Module, state: Dict[str, torch.Tensor]):
        self._drafter = drafter
        self._state = state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._drafter, name)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """The gathered full state dict (CPU tensors)."""
        return dict(self._state)

    def checkpoint_tensors(self) -> Dict[str, torch.Tensor]:
        """The gathered state dict detached on CPU in ``spec.dtype`` (the drafter's ``checkpoint_tensors``)."""
        dtype = getattr(torch, self._drafter.spec.dtype)
        return {n: t.detach().to("cpu", dtype).contiguous() for n, t in self._state.items()}

    def save_pretrained(self, out_dir, *, overwrite: bool = False):
        """The drafter's ``save_pretrained`` on the gathered tensors."""
        from sglang_specopd.wire.drafters.init import save_drafter

        return save_drafter(self._drafter.spec, self.checkpoint_tensors(), out_dir, overwrite=overwrite)


def pushable(drafter: torch.nn.Module) -> Any:
    """What to hand ``push(step, drafter)``: the drafter itself when it is not sharded; under FSDP2 a
    :class:`FullDrafter` on rank 0 and None on the other ranks. COLLECTIVE under FSDP2 (every rank calls it)."""
    if not is_sharded(drafter):
        return drafter
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(drafter, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return FullDrafter(drafter, state) if dist.get_rank() == 0 else None


@torch.no_grad()
def materialize(drafter: torch.nn.Module) -> None:
    """Turn an FSDP2-sharded drafter's parameters back into plain full ``nn.Parameter`` s on every rank (same
    names, values and ``requires_grad``), so that it is an ordinary module again after training (the loss module
    that was sharded must not be called any more). COLLECTIVE; a no-op for an unsharded drafter."""
    if not is_sharded(drafter):
        return
    from torch.distributed.tensor import DTensor

    for module in drafter.modules():
        for name, p in list(module._parameters.items()):
            if isinstance(p, DTensor):
                module._parameters[name] = torch.nn.Parameter(p.full_tensor().detach().clone(),
                                                              requires_grad=p.requires_grad)
