"""Verified-only kernels: on CUDA a Triton / FlashInfer kernel runs by default only after the GPU acceptance run
(``benchmarks/kernels_gpu/run.py``) checked it against its reference on a GPU, for exactly the source it runs now.

Kernels (:data:`KERNELS`): ``tree_attention_triton``, ``tree_attention_flashinfer``, ``gdn_replay_triton``,
``e2e_tv_fused``, ``sparse_attention_triton``. Each is tied to its source files; :func:`source_sha256` hashes them
(with the shared Triton helpers). The acceptance run writes one record per kernel into :data:`RECORDS_FILE`
(``verified_kernels.json`` beside this module, shipped with the package): ``{kernel: {source_sha256, passed,
device: "cuda", gpu, torch, triton, git_commit, created, checks, worst: {...}}}``. A kernel is *verified* when its
record passed on CUDA and its hash equals the current source's; any edit of the kernel un-verifies it.

Choice per op and device (:func:`choose`): on CPU nothing changes (the torch path; a kernel only when asked for by
its own environment variable, e.g. ``SPECOPD_TREE_ATTENTION=triton`` under ``TRITON_INTERPRET=1``). On CUDA, the
op's own variable (``SPECOPD_TREE_ATTENTION``, ``SPECOPD_SPARSE_ATTENTION``, ``SPECOPD_GDN_REPLAY``,
``SPECOPD_E2E_TV``: a backend name, or ``verified``) wins, else ``SPECOPD_KERNELS`` (``verified``, the default;
``triton``: every op's kernel, verified or not; ``torch``: every op's torch path), and ``verified`` picks the
op's first verified kernel, else torch. :func:`describe_choices` is the line the server logs once at start.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch

__all__ = ["KERNELS", "OPS", "RECORDS_FILE", "GLOBAL_ENV", "KernelChoice", "choose", "describe_choices",
           "is_verified", "load_records", "source_sha256", "write_records"]

_PKG = Path(__file__).resolve().parent
RECORDS_FILE = _PKG / "verified_kernels.json"
GLOBAL_ENV = "SPECOPD_KERNELS"
_SHARED = ("lazy_triton.py",)
#: kernel -> its source files (relative to the package), hashed together with the shared Triton helpers.
KERNELS: Dict[str, Tuple[str, ...]] = {
    "tree_attention_triton": ("tree/triton_attention.py", "tree/layout.py"),
    "tree_attention_flashinfer": ("tree/flashinfer_attention.py", "tree/packbits.py", "tree/layout.py"),
    "gdn_replay_triton": ("gdn/triton_replay.py", "gdn/replay.py", "gdn/layout.py"),
    "e2e_tv_fused": ("losses/fused.py",),
    "sparse_attention_triton": ("sparse/triton_sparse.py", "tree/triton_attention.py"),
}


@dataclass(frozen=True)
class Op:
    """One op with kernels: its environment variable and its backends in preference order (``torch`` last;
    every other backend name maps to a kernel of :data:`KERNELS`)."""

    env: str
    backends: Tuple[Tuple[str, Optional[str]], ...]  # (backend name, kernel id or None for torch)


OPS: Dict[str, Op] = {
    "tree_attention": Op("SPECOPD_TREE_ATTENTION", (("triton", "tree_attention_triton"),
                                                    ("flashinfer", "tree_attention_flashinfer"), ("torch", None))),
    "sparse_attention": Op("SPECOPD_SPARSE_ATTENTION", (("triton", "sparse_attention_triton"), ("torch", None))),
    "gdn_replay": Op("SPECOPD_GDN_REPLAY", (("triton", "gdn_replay_triton"), ("torch", None))),
    "e2e_tv": Op("SPECOPD_E2E_TV", (("triton", "e2e_tv_fused"), ("torch", None))),
}


def source_sha256(kernel: str) -> str:
    """sha256 (hex) of the kernel's source files and the shared Triton helpers, in a fixed order. Raises KeyError
    for an unknown kernel."""
    h = hashlib.sha256()
    for rel in KERNELS[kernel] + _SHARED:
        h.update(rel.encode() + b"\0" + (_PKG / rel).read_bytes() + b"\0")
    return h.hexdigest()


def load_records(path: Optional[Path] = None) -> Dict[str, dict]:
    """The records in ``path`` (default :data:`RECORDS_FILE`): kernel -> record; empty when the file is absent.
    Raises ValueError for a file that is not a JSON object with a ``records`` object."""
    p = Path(path) if path is not None else RECORDS_FILE
    if not p.is_file():
        return {}
    data = json.loads(p.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("records"), dict):
        raise ValueError(f"{p}: not a verified-kernel records file (an object with a 'records' object)")
    return dict(data["records"])


def write_records(records: Mapping[str, dict], path: Optional[Path] = None) -> Path:
    """Merge ``records`` (kernel -> record) into ``path`` (default :data:`RECORDS_FILE`): other kernels' records
    stay; written atomically. Returns the path."""
    p = Path(path) if path is not None else RECORDS_FILE
    merged = {**load_records(p), **dict(records)}
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps({"about": "written by benchmarks/kernels_gpu/run.py on a GPU; see specopd_kernels.verified",
                               "records": dict(sorted(merged.items()))}, indent=2) + "\n")
    os.replace(tmp, p)
    return p


def is_verified(kernel: str, records: Optional[Mapping[str, dict]] = None) -> Tuple[bool, str]:
    """``(verified, why)``: whether ``kernel`` has a passed CUDA record for its current source hash."""
    rec = (load_records() if records is None else records).get(kernel)
    if rec is None:
        return False, "no GPU record"
    if rec.get("device") != "cuda" or rec.get("passed") is not True:
        return False, f"its GPU record did not pass (device {rec.get('device')!r}, passed {rec.get('passed')!r})"
    if rec.get("source_sha256") != source_sha256(kernel):
        return False, "its source changed since the GPU record"
    return True, f"verified on {rec.get('gpu') or 'a GPU'} ({rec.get('created', '?')})"


@dataclass(frozen=True)
class KernelChoice:
    """The backend an op runs on a device, and why (``reason``: the environment variable or the record)."""

    op: str
    backend: str
    reason: str


def choose(op: str, device, runs_on: Mapping[str, Callable[[torch.device], bool]],
           records: Optional[Mapping[str, dict]] = None, name: Optional[str] = None) -> KernelChoice:
    """The backend of ``op`` for tensors on ``device`` (module docstring). ``runs_on``: backend -> whether it can
    run there; ``name``: an explicit backend (a function argument) that overrides everything.

    Raises ValueError for an unknown backend name (from ``name`` or a variable) or a named backend that cannot run
    on ``device``."""
    spec = OPS[op]
    what = op.replace("_", "-")
    dev = torch.device(device)
    known = [b for b, _ in spec.backends]
    if name is not None:
        source, wanted = "argument", name
    elif os.environ.get(spec.env):
        source, wanted = spec.env, os.environ[spec.env]
    elif dev.type == "cuda" and os.environ.get(GLOBAL_ENV):
        source, wanted = GLOBAL_ENV, os.environ[GLOBAL_ENV]
    else:
        source, wanted = "default", "verified" if dev.type == "cuda" else "torch"
    if wanted == "verified":
        if dev.type != "cuda":
            return KernelChoice(op, "torch", f"{source}: kernels are verified on CUDA only")
        why = []
        for backend, kernel in spec.backends:
            if kernel is None:
                break
            ok, reason = is_verified(kernel, records)
            if ok and runs_on.get(backend, lambda d: False)(dev):
                return KernelChoice(op, backend, f"{kernel} {reason}")
            why.append(f"{kernel}: {reason if not ok else 'verified, but cannot run here'}")
        return KernelChoice(op, "torch", f"{source} verified: " + "; ".join(why))
    if wanted not in known:
        raise ValueError(f"unknown {what} backend {wanted!r} (from {source}); known: {', '.join(known)}, verified")
    if not runs_on.get(wanted, lambda d: wanted == "torch")(dev):
        raise ValueError(f"{what} backend {wanted!r} cannot run on {dev.type} here (from {source}; triton needs "
                         "CUDA, or TRITON_INTERPRET=1 on CPU; flashinfer needs CUDA and flashinfer)")
    return KernelChoice(op, wanted, f"{source}={wanted}")


def describe_choices(device, runs_on: Mapping[str, Mapping[str, Callable[[torch.device], bool]]],
                     records: Optional[Mapping[str, dict]] = None) -> str:
    """One line: every op's :func:`choose` on ``device`` (``runs_on``: op -> its backends' ``runs_on``), e.g.
    ``"cuda: tree_attention=torch (default verified: tree_attention_triton: no GPU record; ...), ..."``. An op whose
    variable names an unusable backend shows the error instead of raising."""
    parts = []
    for op in OPS:
        try:
            c = choose(op, device, runs_on.get(op, {}), records)
            parts.append(f"{op}={c.backend} ({c.reason})")
        except ValueError as exc:
            parts.append(f"{op}=error ({exc})")
    return f"{torch.device(device).type}: " + ", ".join(parts)


def backends_of(op: str) -> Sequence[str]:
    """The backend names of ``op`` (preference order, ``torch`` last)."""
    return [b for b, _ in OPS[op].backends]
