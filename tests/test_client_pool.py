"""ClientPool: the least-loaded replica takes each generate call; replies and errors pass through unchanged."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from specopd_trainer.client.pool import ClientPool


class _Replica:
    def __init__(self, name, gate=None, fail=False):
        self.name, self.gate, self.fail, self.calls = name, gate, fail, []

    def generate(self, input_ids, **params):
        self.calls.append((list(input_ids), params))
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail:
            raise RuntimeError(f"{self.name} down")
        return {"replica": self.name, "output_ids": [t + 1 for t in input_ids]}


def test_idle_pool_prefers_the_lowest_index_and_passes_params():
    a, b = _Replica("a"), _Replica("b")
    pool = ClientPool([a, b])
    assert pool.generate([1, 2], max_new_tokens=3, temperature=0.0) == {"replica": "a", "output_ids": [2, 3]}
    assert a.calls == [([1, 2], {"max_new_tokens": 3, "temperature": 0.0})] and b.calls == []
    assert pool.in_flight == [0, 0] and pool.served == [1, 0]


def test_requests_in_flight_spread_evenly_over_replicas():
    gate = threading.Event()
    reps = [_Replica(n, gate) for n in "abc"]
    pool = ClientPool(reps)
    with ThreadPoolExecutor(6) as ex:
        futs = [ex.submit(pool.generate, [i], max_new_tokens=1) for i in range(6)]
        for _ in range(200):  # all six requests block inside a replica: two per replica
            if sum(pool.in_flight) == 6:
                break
            threading.Event().wait(0.01)
        assert pool.in_flight == [2, 2, 2]
        gate.set()
        names = sorted(f.result()["replica"] for f in futs)
    assert names == ["a", "a", "b", "b", "c", "c"] and pool.served == [2, 2, 2] and pool.in_flight == [0, 0, 0]


def test_a_failing_replica_raises_and_releases_its_slot():
    pool = ClientPool([_Replica("a", fail=True), _Replica("b")])
    with pytest.raises(RuntimeError, match="a down"):
        pool.generate([5], max_new_tokens=1)
    assert pool.in_flight == [0, 0]
    with pytest.raises(ValueError):
        ClientPool([])
