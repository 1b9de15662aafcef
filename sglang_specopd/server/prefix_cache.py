"""Reference-prefix cache of ``/specopd/score_trees``: each layer's K/V and the final hidden states of a prefix.

A SpecOPD trainer scores the same reference many times (a new set of anchors and branches at every visit), and
the prefix is the fixed part of a tree forward's cost (measured ~0.2 s of a ~0.7 s call for two 434-token
SmolLM2 references on 2 CPU cores). The first call for a reference records, per attention layer, the keys
(after RoPE) and values of its prefix rows as the target computed them, plus the prefix's final normed hidden
states; later calls run only the tree nodes through the layers, attending to the recorded prefix K/V
(:func:`specopd_kernels.tree.tree_attention_grouped` with ``prefix_kv``), and read anchor rows from the recorded
hidden states. A call whose trees are all root-only needs no forward at all. Values equal a full forward up to
the rounding of the target's matmuls at a different row count (within 1e-4 in float32 in the tests; bf16
matmuls round by batch shape).

The cache is off unless a size is given (``score_trees_prefix_cache_mb`` in a server config, passed to the
scheduler as ``SPECOPD_PREFIX_CACHE_MB``); entries live on the target's device, evicted least-recently-used
beyond the budget. Keys are a hash of the token ids. It is cleared whenever SGLang updates the target's
weights (:func:`register_prefix_cache`), so a cached prefix never outlives the weights that computed it.
Like the KV cache, it is the server's memory: on a GPU size it from what ``mem_fraction_static`` leaves free.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import torch

ENV_VAR = "SPECOPD_PREFIX_CACHE_MB"


def prefix_key(input_ids: Sequence[int]) -> bytes:
    """A collision-resistant key for a token sequence: blake2b-128 of its int64 bytes (length included)."""
    ids = torch.as_tensor(list(input_ids), dtype=torch.int64)
    return hashlib.blake2b(ids.numpy().tobytes(), digest_size=16).digest() + len(ids).to_bytes(8, "little")


@dataclass
class PrefixEntry:
    """One reference prefix: ``length`` P rows; ``kv[layer_id] = (k [P, Hkv, D], v [P, Hkv, D])`` as the layer's
    attention received them (k after RoPE, in the attention's dtype); ``hidden`` ``[P, H]``, the final normed hidden states."""

    length: int
    kv: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    hidden: Optional[torch.Tensor] = None

    @property
    def nbytes(self) -> int:
        n = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv.values())
        return n + (0 if self.hidden is None else self.hidden.numel() * self.hidden.element_size())


class PrefixCache:
    """LRU map ``prefix_key -> PrefixEntry`` under a byte budget; ``hits`` / ``misses`` count lookups."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"prefix cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self._entries: "OrderedDict[bytes, PrefixEntry]" = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Optional[PrefixEntry]:
        """The entry for ``key`` (now most recently used), or None; counts a hit or a miss."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: bytes, entry: PrefixEntry) -> bool:
        """Store ``entry`` (evicting least-recently-used entries to fit); False if it alone exceeds the budget."""
        size = entry.nbytes
        if not self.enabled or size > self.budget_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        while self._entries and self.bytes + size > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.nbytes
            self.evictions += 1
        self._entries[key] = entry
        self.bytes += size
        return True

    def clear(self) -> None:
        """Drop every entry (the target's weights changed)."""
        self._entries.clear()
        self.bytes = 0

    def stats(self) -> Dict[str, int]:
        """Entries and bytes now; hits, misses and evictions since the server started (a clear keeps them)."""
        return {"entries": len(self._entries), "bytes": self.bytes, "budget_bytes": self.budget_bytes,
                "hits": self.hits, "misses": self.misses, "evictions": self.evictions}


def budget_from_env(environ=None) -> int:
    """Bytes from ``SPECOPD_PREFIX_CACHE_MB`` (unset or 0: off). Raises ValueError on a non-integer or < 0."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if not raw:
        return 0
    try:
        mb = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_VAR} must be an integer number of MiB, got {raw!r}") from None
    if mb < 0:
        raise ValueError(f"{ENV_VAR} must be >= 0, got {mb}")
    return mb * 2**20


_CACHE: Optional[PrefixCache] = None


def scheduler_cache() -> PrefixCache:
    """This process's cache (the scheduler's), sized from the environment on first use."""
    global _CACHE
    if _CACHE is None:
        _CACHE = PrefixCache(budget_from_env())
    return _CACHE


_WEIGHT_UPDATES = 0


def weight_updates() -> int:
    """How many target weight updates this process has seen (the budgeted score queue restarts a request that
    was mid-way through when this changes)."""
    return _WEIGHT_UPDATES


def _clear_before_weight_update(*args, **kwargs):
    """BEFORE hook on SGLang's target weight updates: the cached prefixes were computed by the old weights."""
    global _WEIGHT_UPDATES
    _WEIGHT_UPDATES += 1
    if _CACHE is not None:
        _CACHE.clear()
    return None


def register_prefix_cache() -> None:
    """Clear the cache before every target weight update SGLang offers (disk, tensor, IPC, distributed)."""
    from sglang_specopd.server import compat

    for name in compat.WEIGHT_UPDATE_HOOKS:
        compat.hook(name, _clear_before_weight_update)
