"""Bit packing of boolean attention masks, FlashInfer-compatible (pure torch, any device).

Semantics follow ``numpy.packbits`` as FlashInfer's ``flashinfer.packbits`` / ``segment_packbits`` do
(flashinfer/quantization/packbits.py): the output byte j holds elements 8j..8j+7, zero-padded at the end.
bitorder "big": element 8j+i is bit 7-i of byte j (numpy / flashinfer public default);
bitorder "little": element 8j+i is bit i of byte j (what FlashInfer's prefill kernels read for custom masks).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

__all__ = ["packbits", "unpackbits", "segment_packbits", "FlashInferMask", "flashinfer_custom_mask"]

_ORDERS = ("big", "little")


def _bit_shift(offsets: torch.Tensor, bitorder: str) -> torch.Tensor:
    if bitorder not in _ORDERS:
        raise ValueError(f"bitorder must be 'big' or 'little', got {bitorder!r}")
    return offsets % 8 if bitorder == "little" else 7 - offsets % 8


def _check_flat_bool(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
    if x.dtype != torch.bool:
        if x.dtype.is_floating_point or x.dtype.is_complex:
            raise TypeError(f"{name} must be bool or integer 0/1, got {x.dtype}")
        if ((x != 0) & (x != 1)).any():
            raise ValueError(f"{name} must be binary (0/1)")
        x = x.bool()
    return x


def packbits(x: torch.Tensor, bitorder: str = "big") -> torch.Tensor:
    """Pack a 1-D binary array into bits: bool [n] -> uint8 [ceil(n/8)] (numpy.packbits semantics).

    The default bitorder "big" matches ``flashinfer.packbits``.  Raises ValueError (bad bitorder / shape /
    non-binary values) or TypeError (non-tensor / float input).
    """
    x = _check_flat_bool(x, "x")
    n = x.numel()
    offs = torch.arange(n, device=x.device)
    vals = x.to(torch.int32) << _bit_shift(offs, bitorder).to(torch.int32)
    out = torch.zeros((n + 7) // 8, dtype=torch.int32, device=x.device)
    out.index_add_(0, offs // 8, vals)
    return out.to(torch.uint8)


def unpackbits(packed: torch.Tensor, n: int, bitorder: str = "big") -> torch.Tensor:
    """Inverse of :func:`packbits`: uint8 [ceil(n/8)] -> bool [n].

    Raises TypeError if packed is not uint8, ValueError if it has the wrong length or bitorder is bad.
    """
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError("packed must be a uint8 torch.Tensor")
    if packed.dim() != 1 or packed.numel() != (n + 7) // 8:
        raise ValueError(f"packed must have shape [{(n + 7) // 8}] for n={n}, got {tuple(packed.shape)}")
    offs = torch.arange(n, device=packed.device)
    return ((packed.to(torch.int32)[offs // 8] >> _bit_shift(offs, bitorder).to(torch.int32)) & 1).bool()


def segment_packbits(mask_flat: torch.Tensor, indptr: torch.Tensor, bitorder: str = "little"):
    """Pack every segment ``mask_flat[indptr[i]:indptr[i+1]]`` independently into ceil(len_i/8) bytes.

    mask_flat: bool [total].  indptr: int [B+1], indptr[0] == 0, non-decreasing, indptr[-1] == total.
    Returns (packed uint8 [new_indptr[-1]], new_indptr int32 [B+1]) with
    new_indptr[i+1]-new_indptr[i] == (indptr[i+1]-indptr[i]+7)//8, exactly like
    ``flashinfer.segment_packbits``.  Note: our default bitorder is "little" (the layout FlashInfer's
    BatchPrefill ``plan`` produces from ``custom_mask``); flashinfer's public function defaults to "big".
    Raises ValueError on an inconsistent indptr or bad bitorder.
    """
    x = _check_flat_bool(mask_flat, "mask_flat")
    if not isinstance(indptr, torch.Tensor):
        indptr = torch.as_tensor(indptr)
    if indptr.dim() != 1 or indptr.numel() < 1 or indptr.dtype.is_floating_point:
        raise ValueError(f"indptr must be a 1-D integer tensor of length B+1, got {tuple(indptr.shape)} {indptr.dtype}")
    ip = indptr.to(device=x.device, dtype=torch.int64)
    if int(ip[0]) != 0 or int(ip[-1]) != x.numel() or (ip[1:] < ip[:-1]).any():
        raise ValueError(f"indptr must start at 0, be non-decreasing and end at {x.numel()}, got {ip.tolist()}")
    seglen = ip[1:] - ip[:-1]
    new_ip = torch.zeros_like(ip)
    new_ip[1:] = torch.cumsum((seglen + 7) // 8, 0)
    seg = torch.repeat_interleave(torch.arange(seglen.numel(), device=x.device), seglen)
    local = torch.arange(x.numel(), device=x.device) - ip[seg]
    vals = x.to(torch.int32) << _bit_shift(local, bitorder).to(torch.int32)
    out = torch.zeros(int(new_ip[-1]), dtype=torch.int32, device=x.device)
    out.index_add_(0, new_ip[seg] + local // 8, vals)
    return out.to(torch.uint8), new_ip.to(torch.int32)


class FlashInferMask(NamedTuple):
    """Custom mask for ``BatchPrefillWith{Ragged,Paged}KVCacheWrapper.plan``.

    custom_mask: bool [sum q_len*kv_len] (row-major per request, concatenated) - pass as ``custom_mask``.
    qo_indptr, kv_indptr: int32 [B+1] token offsets.  mask_indptr: int32 [B+1] offsets into custom_mask.
    packed_mask: uint8, little bit order per request segment - pass as ``packed_custom_mask``.
    packed_indptr: int32 [B+1] byte offsets into packed_mask.
    """

    custom_mask: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    mask_indptr: torch.Tensor
    packed_mask: torch.Tensor
    packed_indptr: torch.Tensor


def flashinfer_custom_mask(masks: Sequence[torch.Tensor]) -> FlashInferMask:
    """Flatten per-request masks (bool [q_len_b, kv_len_b], True = attend) for FlashInfer BatchPrefill.

    Raises ValueError on an empty list or a non-2-D mask, TypeError on a non-bool mask.
    """
    if len(masks) == 0:
        raise ValueError("empty input: no masks")
    for i, m in enumerate(masks):
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            raise TypeError(f"masks[{i}] must be a bool tensor")
        if m.dim() != 2:
            raise ValueError(f"masks[{i}] must be 2-D [q_len, kv_len], got shape {tuple(m.shape)}")
    dev = masks[0].device
    q = torch.tensor([m.shape[0] for m in masks], dtype=torch.int64, device=dev)
    kv = torch.tensor([m.shape[1] for m in masks], dtype=torch.int64, device=dev)

    def indptr(lens: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(lens.numel() + 1, dtype=torch.int64, device=dev)
        out[1:] = torch.cumsum(lens, 0)
        return out

    flat = torch.cat([m.reshape(-1) for m in masks])
    mask_ip = indptr(q * kv)
    packed, packed_ip = segment_packbits(flat, mask_ip, "little")
    i32 = torch.int32
    return FlashInferMask(flat, indptr(q).to(i32), indptr(kv).to(i32), mask_ip.to(i32), packed, packed_ip)
