"""The score_trees reference-prefix cache's bookkeeping: keys, LRU eviction under a byte budget, sizing from the
environment and the server config (the cached forward itself is checked on a real server in test_score_trees.py)."""

from __future__ import annotations

import pytest
import torch

from sglang_specopd.server.prefix_cache import ENV_VAR, PrefixCache, PrefixEntry, budget_from_env, prefix_key


def _entry(length: int, layers: int = 2, width: int = 4) -> PrefixEntry:
    e = PrefixEntry(length, {i: (torch.zeros(length, width), torch.zeros(length, width)) for i in range(layers)})
    e.hidden = torch.zeros(length, width)
    return e


def test_entry_size_counts_every_tensor() -> None:
    # 2 layers x (k + v) x 10 x 4 fp32 + hidden 10 x 4 fp32 = (4 + 1) x 160 bytes
    assert _entry(10).nbytes == 5 * 160


def test_keys_separate_sequences_and_lengths() -> None:
    assert prefix_key([1, 2, 3]) == prefix_key([1, 2, 3])
    assert len({prefix_key([1, 2, 3]), prefix_key([1, 2, 4]), prefix_key([1, 2]), prefix_key([3, 2, 1])}) == 4


def test_lru_eviction_under_the_budget() -> None:
    size = _entry(10).nbytes
    cache = PrefixCache(budget_bytes=2 * size)
    assert cache.put(b"a", _entry(10)) and cache.put(b"b", _entry(10))
    assert cache.get(b"a") is not None  # a is now the most recently used
    assert cache.put(b"c", _entry(10))  # evicts b, the least recently used
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.get(b"c") is not None
    assert cache.stats() == {"entries": 2, "bytes": 2 * size, "budget_bytes": 2 * size, "hits": 3, "misses": 1,
                             "evictions": 1}
    assert not cache.put(b"big", _entry(30))  # larger than the whole budget: not stored, nothing evicted
    assert len(cache) == 2
    assert cache.put(b"a", _entry(10))  # replacing an entry does not double-count it
    assert cache.bytes == 2 * size
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0 and cache.get(b"a") is None


def test_disabled_cache_stores_nothing() -> None:
    cache = PrefixCache(0)
    assert not cache.enabled and not cache.put(b"a", _entry(1)) and len(cache) == 0
    with pytest.raises(ValueError, match=">= 0 bytes"):
        PrefixCache(-1)


def test_budget_from_env() -> None:
    assert budget_from_env({}) == 0
    assert budget_from_env({ENV_VAR: "0"}) == 0
    assert budget_from_env({ENV_VAR: " 64 "}) == 64 * 2**20
    with pytest.raises(ValueError, match="integer number of MiB"):
        budget_from_env({ENV_VAR: "1.5G"})
    with pytest.raises(ValueError, match=">= 0"):
        budget_from_env({ENV_VAR: "-3"})


def test_server_config_sizes_the_cache_through_the_scheduler_env() -> None:
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import server_env
    from sglang_specopd.app.serve.spec import config_path

    cpu = ServeConfig.load(config_path("cpu-smollm2"))
    assert cpu.score_trees_prefix_cache_mb == 4096
    assert ServeConfig.load(config_path("gpu-qwen3-8b-dflash")).score_trees_prefix_cache_mb == 0
    assert server_env("cpu", base={}, prefix_cache_mb=cpu.score_trees_prefix_cache_mb)[ENV_VAR] == "4096"
    assert server_env("cuda", base={ENV_VAR: "99"})[ENV_VAR] == "0"  # the spec decides, not the caller's shell
