"""Live-traffic recording on a real SGLang server (tiny fp32 target, SPECOPD, random block-4 drafter).

One server (conftest's shared ``tiny_admin_server``), ``--admin-api-key`` and a ~5 kB traffic spool
(``traffic_spool_mb`` = 0.005: a handful of tiny requests fill it), so a flood of 24 requests through
``/generate`` and ``/v1/chat/completions`` must evict. Checked: the admin key is required (401 without it or with a
wrong one), the spool stays within its budget and holds the newest requests exactly as served (prompt length,
output ids, the trace a traced request got in its reply), replies of requests that did not ask for a trace carry
none, a client reads each item once, and purge empties the spool.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import TINY_ADMIN_KEY, TINY_ADMIN_SPOOL_MB, RunningServer
from sglang_specopd.wire.traffic import TRAFFIC_PATH, TRAFFIC_PURGE_PATH

pytestmark = pytest.mark.server

ADMIN_KEY = TINY_ADMIN_KEY
SPOOL_MB = TINY_ADMIN_SPOOL_MB  # 5,242 bytes
NEW_TOKENS = 16
TRACE_KEY = "specopd_trace"


@pytest.fixture(scope="module")
def traffic_server(tiny_admin_server: RunningServer) -> RunningServer:
    """conftest's shared tiny SPECOPD server: admin key and the ~5 kB spool (serving its start-up drafter)."""
    assert tiny_admin_server.spec.traffic_spool_mb == SPOOL_MB
    return tiny_admin_server


def admin_client(srv: RunningServer, key: str = ADMIN_KEY):
    from specopd_trainer.client.http import SpecOPDClient

    return SpecOPDClient(srv.url, admin_api_key=key, retries=0)


def generate(srv: RunningServer, i: int, trace: bool) -> dict:
    return srv.generate(f"Request number {i} says hello", NEW_TOKENS, trace=trace)


def chat(srv: RunningServer, i: int) -> dict:
    r = srv.post("/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": f"Chat number {i}"}], "max_tokens": NEW_TOKENS,
        "temperature": 0, "ignore_eos": True, "return_meta_info": True})
    assert r.status_code == 200, r.text[:300]
    return r.json()["choices"][0]["meta_info"]


def test_traffic_routes_need_the_admin_key(traffic_server) -> None:
    generate(traffic_server, -1, False)  # something to leak, were the key not checked
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_KEY}):
        for method, path in (("GET", TRAFFIC_PATH), ("POST", TRAFFIC_PURGE_PATH)):
            r = httpx.request(method, traffic_server.url + path, headers=headers, timeout=60)
            assert r.status_code == 401, (method, path, headers, r.status_code, r.text[:300])
            assert "input_ids" not in r.text
    r = httpx.get(traffic_server.url + TRAFFIC_PATH + "?max_items=0",
                  headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
    assert r.status_code == 400 and "max_items must be in 1..4096" in r.text, r.text[:300]


def test_flood_stays_within_budget_and_holds_the_newest_requests_as_served(traffic_server) -> None:
    srv = traffic_server
    with admin_client(srv) as client:
        client.purge_traffic()
        client.traffic(4096)  # move the cursor past anything older
        before = client.last_traffic.stats
        jobs = [("generate", i, i % 2 == 0) for i in range(16)] + [("chat", i, False) for i in range(8)]

        def run(job):
            kind, i, trace = job
            return generate(srv, i, trace) if kind == "generate" else chat(srv, i)

        with ThreadPoolExecutor(max_workers=4) as pool:
            replies = list(pool.map(run, jobs))
        last = [generate(srv, 50 + i, trace=i != 1) for i in range(3)]  # the newest three, in this order
        for (kind, _, trace), rep in zip(jobs + [("generate", 0, True), ("generate", 0, False),
                                                 ("generate", 0, True)], replies + last):
            meta = rep["meta_info"] if kind == "generate" else rep
            # recording every request puts no records into replies that did not ask (at most an empty list, as
            # SGLang gives every request of a batch in which one asked)
            assert bool(meta.get(TRACE_KEY)) == trace, (kind, trace, meta.get(TRACE_KEY))
        items = client.traffic(4096)
        reply = client.last_traffic
    total = len(jobs) + len(last)
    stats = reply.stats
    assert stats.budget_bytes == int(SPOOL_MB * 2**20)
    assert stats.recorded - before.recorded == total, "every finished request was spooled"
    assert 0 < stats.bytes <= stats.budget_bytes and stats.evicted > before.evicted, stats
    assert 3 <= len(items) == stats.items < total
    assert reply.missed == total - len(items), "the evicted ones are reported missed"
    for item in items:
        out = item["input_ids"][item["prompt_len"]:]
        assert len(out) == NEW_TOKENS and item["trace"], item
        assert {r["drafter_version"] for r in item["trace"]} == {"initial"}
        assert item["trace"][0]["anchor"] == item["prompt_len"], "first verify step anchored at the prefill's token"
    for item, rep in zip(items[-3:], last):
        meta = rep["meta_info"]
        assert item["input_ids"][item["prompt_len"]:] == rep["output_ids"]
        assert item["prompt_len"] == meta["prompt_tokens"] and len(item["trace"]) == meta["spec_verify_ct"]
        if meta.get(TRACE_KEY):
            assert item["trace"] == meta[TRACE_KEY], "the spool keeps the trace the reply had"


def test_each_item_is_read_once_and_purge_empties_the_spool(traffic_server) -> None:
    srv = traffic_server
    with admin_client(srv) as client:
        client.traffic(4096)
        assert client.traffic(4096) == []
        outs = [generate(srv, 100 + i, False)["output_ids"] for i in range(2)]
        new = client.traffic(4096)
        assert [it["input_ids"][it["prompt_len"]:] for it in new] == outs
        assert client.traffic(4096) == [] and client.last_traffic.missed == 0
        held = client.last_traffic.stats.items
        assert held >= 2
        assert client.purge_traffic() == held
        assert client.traffic(4096) == []
        stats = client.last_traffic.stats
        assert (stats.items, stats.bytes) == (0, 0) and stats.purged >= held
    with admin_client(srv, "wrong") as intruder:
        from specopd_trainer.client.http import ServerRequestError

        with pytest.raises(ServerRequestError) as err:
            intruder.purge_traffic()
        assert err.value.status == 401
