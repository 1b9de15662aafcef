"""Live-traffic spool without a server: the ring buffer's byte budget under a flood, the cursor, purge, the wire
models, the query parser, the scheduler op, the config key, trace records with drafter versions, the trace-param
check, and the client's cursor against the spool behind a mock transport. (The real-server tests are in
``test_traffic_server.py``.)"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import httpx
import pytest

from sglang_specopd.server.traffic import spool as traffic
from sglang_specopd.server.traces import check_trace_param, record_verify_step, take_all, take_pending
from sglang_specopd.server.traffic.spool import (
    OFF_REASON,
    SPOOL_BYTES_ENV,
    TrafficSpool,
    parse_read_query,
    record_finished,
    spool_budget_bytes,
    spool_env,
    traffic_op,
)
from sglang_specopd.wire.traffic import MAX_ITEMS_PER_READ, PurgeReply, TrafficReply


def _trace(n: int, version: str = "v1") -> list:
    return [{"anchor": 10 + i, "proposed": [1, 2, 3], "accepted": i % 4, "drafter_version": version}
            for i in range(n)]


def _read(spool: TrafficSpool, **kw) -> TrafficReply:
    return TrafficReply.model_validate_json(spool.read(**kw))


def test_flood_stays_within_the_byte_budget_and_keeps_the_newest() -> None:
    """5,000 items of random sizes into a 20 kB spool: after every add the bytes held are within the budget and
    equal the sum of the held items' JSON sizes; what is held is exactly the newest items; every eviction counted."""
    rng = random.Random(0)
    budget = 20_000
    spool = TrafficSpool(budget, clock=lambda: 1.5)
    for i in range(5000):
        n = rng.randint(1, 120)
        seq = spool.add(list(range(n)), rng.randint(0, n), _trace(rng.randint(0, 6)))
        assert seq == i + 1
        assert spool.bytes <= budget
    held = _read(spool, after=0, max_items=MAX_ITEMS_PER_READ)
    stats = held.stats
    assert stats.items == len(held.items) == len(spool) > 20
    assert stats.bytes == spool.bytes == sum(len(json.dumps(it.model_dump(exclude_none=True),
                                                            separators=(",", ":"))) for it in held.items)
    assert stats.recorded == 5000 and stats.evicted == 5000 - stats.items and stats.dropped_oversize == 0
    seqs = [it.seq for it in held.items]
    assert seqs == list(range(5001 - stats.items, 5001)), "the newest items, oldest first, contiguous"
    assert held.missed == 5000 - stats.items and held.next_after == 5000
    assert stats.oldest_seq == seqs[0] and stats.newest_seq == 5000
    assert all(it.finished_at == 1.5 for it in held.items)


def test_one_item_larger_than_the_budget_is_dropped_and_seen_as_missed() -> None:
    spool = TrafficSpool(400)
    assert spool.add([1, 2, 3], 1, _trace(1)) == 1
    assert spool.add(list(range(500)), 10, []) is None  # ~2 kB alone
    assert spool.add([4, 5], 1, []) == 3
    reply = _read(spool, after=0, max_items=10)
    assert [it.seq for it in reply.items] == [1, 3] and reply.missed == 1
    assert reply.stats.dropped_oversize == 1 and reply.stats.evicted == 0


def test_cursor_reads_each_item_once_and_nothing_is_removed() -> None:
    spool = TrafficSpool(1 << 20)
    for i in range(10):
        spool.add([i, i + 1, i + 2], 1, _trace(2))
    a = _read(spool, after=0, max_items=4)
    assert [it.seq for it in a.items] == [1, 2, 3, 4] and a.next_after == 4 and a.missed == 0
    b = _read(spool, after=a.next_after, max_items=100)
    assert [it.seq for it in b.items] == list(range(5, 11)) and b.next_after == 10
    again = _read(spool, after=a.next_after, max_items=100)  # a retried read (lost reply): the same items
    assert again.items == b.items and len(spool) == 10
    empty = _read(spool, after=10, max_items=5)
    assert empty.items == [] and empty.next_after == 10 and empty.missed == 0
    item = a.items[0]
    assert item.input_ids == [0, 1, 2] and item.prompt_len == 1 and item.trace[1].drafter_version == "v1"


def test_reply_bytes_cap_returns_at_least_one_item() -> None:
    spool = TrafficSpool(1 << 20)
    for _ in range(5):  # a fixed finished_at: the clock's float repr varies in length, and so would the items
        spool.add(list(range(100)), 50, [], finished_at=1.5)
    one_size = len(spool._data[0])
    assert all(len(d) == one_size for d in spool._data)
    reply = _read(spool, after=0, max_items=5, max_bytes=2 * one_size + 1)
    assert [it.seq for it in reply.items] == [1, 2] and reply.next_after == 2 and reply.missed == 0
    assert [it.seq for it in _read(spool, after=0, max_items=5, max_bytes=1).items] == [1]


def test_purge_drops_everything_keeps_numbering_and_readers_see_it_as_missed() -> None:
    spool = TrafficSpool(1 << 20, spool_id="s1")
    for i in range(6):
        spool.add([i], 0, [])
    assert _read(spool, after=0, max_items=2).next_after == 2
    assert spool.purge() == 6
    st = spool.stats()
    assert (st["items"], st["bytes"], st["purged"], st["oldest_seq"], st["newest_seq"]) == (0, 0, 6, 0, 6)
    after = _read(spool, after=2, max_items=10)
    assert after.items == [] and after.missed == 4 and after.next_after == 6
    assert spool.add([9], 0, []) == 7


def test_cursor_of_another_spool_restarts_and_a_future_cursor_is_refused() -> None:
    spool = TrafficSpool(1 << 20, spool_id="now")
    for i in range(3):
        spool.add([i], 0, [])
    restarted = _read(spool, after=50, max_items=10, spool_id="before-restart")
    assert [it.seq for it in restarted.items] == [1, 2, 3] and restarted.spool_id == "now"
    with pytest.raises(ValueError, match="after=50 is outside 0..3"):
        spool.read(after=50, max_items=10, spool_id="now")
    for bad in (0, MAX_ITEMS_PER_READ + 1):
        with pytest.raises(ValueError, match="max_items"):
            spool.read(max_items=bad)
    with pytest.raises(ValueError, match="prompt_len"):
        spool.add([1, 2], 3, [])
    with pytest.raises(ValueError, match="budget"):
        TrafficSpool(0)


def test_parse_read_query() -> None:
    assert parse_read_query({}) == {"after": 0, "max_items": 256, "spool_id": None}
    assert parse_read_query({"after": "7", "max_items": "3", "spool_id": "x"}) == {
        "after": 7, "max_items": 3, "spool_id": "x"}
    for query, msg in (({"max_items": "0"}, "max_items must be in 1..4096"), ({"max_items": "lots"}, "integer"),
                       ({"after": "-1"}, "after must be in"), ({"cursor": "1"}, "unknown query parameter")):
        with pytest.raises(ValueError, match=msg):
            parse_read_query(query)


def test_spool_budget_from_the_environment_and_config() -> None:
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import LaunchSpec, server_env
    from sglang_specopd.app.serve.spec import config_path, shipped_config_names

    assert spool_budget_bytes({}) == 0 and spool_budget_bytes({SPOOL_BYTES_ENV: "4096"}) == 4096
    for raw in ("-1", "big"):
        with pytest.raises(ValueError, match=SPOOL_BYTES_ENV):
            spool_budget_bytes({SPOOL_BYTES_ENV: raw})
    assert spool_env(0.5) == {SPOOL_BYTES_ENV: str(2**19)}
    # off by default: the config key, every shipped config, the launch spec and the server environment
    assert ServeConfig(name="x", target="t").traffic_spool_mb == 0
    # (except the one that exists for `specopd adapt` and the main job, whose header says what it keeps)
    assert all(ServeConfig.load(config_path(n)).traffic_spool_mb == 0 for n in shipped_config_names()
               if not n.endswith("-adapt"))
    assert ServeConfig.load(config_path("cpu-smollm2-adapt")).traffic_spool_mb > 0
    assert LaunchSpec(model_path="m").traffic_spool_mb == 0
    assert server_env("cuda", base={SPOOL_BYTES_ENV: "999"})[SPOOL_BYTES_ENV] == "0"  # the config decides
    assert server_env("cuda", base={}, traffic_spool_mb=2)[SPOOL_BYTES_ENV] == str(2 * 2**20)
    with pytest.raises(ValueError):
        ServeConfig(name="x", target="t", traffic_spool_mb=-1)


def _req(custom_params=None, *, finished=True, reason="length", prompt=(5, 6), output=(7, 8, 9)):
    finish = SimpleNamespace(to_json=lambda: {"type": reason}) if reason else None
    return SimpleNamespace(sampling_params=SimpleNamespace(custom_params=custom_params), finished=lambda: finished,
                           finished_reason=finish, origin_input_ids=list(prompt), output_ids_through_stop=list(output))


def test_records_carry_the_drafter_version_and_keep_all_only_when_asked() -> None:
    asked, plain = _req({"specopd_trace": True}), _req(None)
    record_verify_step([asked, plain], [4, 9], [[1, 2, 3], [4, 5, 6]], [2, 0], "v7")
    assert take_pending(asked) == [{"anchor": 4, "proposed": [1, 2, 3], "accepted": 2, "drafter_version": "v7"}]
    assert take_pending(plain) == [] and take_all(asked) == [] and take_all(plain) == []
    record_verify_step([asked, plain], [7, 10], [[1, 1, 1], [2, 2, 2]], [0, 3], "v8", keep_all=True)
    assert [r["drafter_version"] for r in take_pending(asked)] == ["v8"] and take_pending(plain) == []
    assert take_all(plain) == [{"anchor": 10, "proposed": [2, 2, 2], "accepted": 3, "drafter_version": "v8"}]
    assert take_all(asked)[0]["anchor"] == 7


@pytest.mark.parametrize("value", ["yes", 1, 0, {}, [], None, "true"])
def test_a_non_bool_trace_param_is_refused(value) -> None:
    with pytest.raises(ValueError, match="specopd_trace must be true or false"):
        check_trace_param({"specopd_trace": value})


def test_bool_or_absent_trace_params_pass() -> None:
    for params in ({"specopd_trace": True}, {"specopd_trace": False}, {}, {"other": 1}, None, [1], "x"):
        check_trace_param(params)


@pytest.fixture
def fresh_spool(monkeypatch):
    """Recording on (1 MiB) in this process, with a new spool; reset afterwards."""
    monkeypatch.setenv(SPOOL_BYTES_ENV, str(2**20))
    monkeypatch.setattr(traffic, "_SPOOL", None)
    monkeypatch.setattr(traffic, "_OFF", False)
    yield


def test_record_finished_spools_finished_requests_once(fresh_spool) -> None:
    done = _req(None)
    record_verify_step([done], [2], [[1, 2, 3]], [1], "initial", keep_all=True)
    running, aborted = _req(None, finished=False), _req(None, reason="abort")
    assert record_finished([done, running, aborted]) == 1
    assert record_finished([done]) == 0  # streamed again (overlap schedule): not spooled twice
    reply = _read(traffic.spool(), after=0, max_items=10)
    (item,) = reply.items
    assert item.input_ids == [5, 6, 7, 8, 9] and item.prompt_len == 2
    assert [r.model_dump() for r in item.trace] == [
        {"anchor": 2, "proposed": [1, 2, 3], "accepted": 1, "drafter_version": "initial"}]


def test_health_check_generations_are_never_spooled(fresh_spool) -> None:
    """SGLang's /health runs a one-token generation (rid HEALTH_CHECK_...); a router health-checks every worker so."""
    from types import SimpleNamespace as NS

    health, user = NS(**vars(_req(None)), rid="HEALTH_CHECK_0a1b"), NS(**vars(_req(None)), rid="HEALTH-user")
    assert record_finished([health, user]) == 1 and traffic.spool().stats()["recorded"] == 1


def test_record_finished_is_a_no_op_when_recording_is_off(monkeypatch) -> None:
    monkeypatch.delenv(SPOOL_BYTES_ENV, raising=False)
    monkeypatch.setattr(traffic, "_SPOOL", None)
    monkeypatch.setattr(traffic, "_OFF", False)
    assert record_finished([_req(None)]) == 0 and traffic.spool() is None


def test_traffic_op_statuses(fresh_spool, monkeypatch) -> None:
    specopd = SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm="SPECOPD"))
    plain = SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm=None))
    traffic.spool().add([1, 2, 3], 1, [])
    read = json.dumps({"action": "read", "after": 0, "max_items": 5, "spool_id": None}).encode()
    status, _, body = traffic_op(specopd, read)
    assert status == 200 and len(TrafficReply.model_validate_json(body).items) == 1
    assert traffic_op(plain, read)[:2] == (409, "live-traffic recording needs a SPECOPD server (this one serves "
                                                "speculative_algorithm=none): no traces to record")
    status, _, body = traffic_op(specopd, b'{"action": "purge"}')
    assert status == 200 and PurgeReply.model_validate_json(body).purged == 1
    monkeypatch.setenv(SPOOL_BYTES_ENV, "0")
    monkeypatch.setattr(traffic, "_SPOOL", None)
    monkeypatch.setattr(traffic, "_OFF", False)
    assert traffic_op(specopd, read) == (404, OFF_REASON, b"")


def _mock_client(spool: TrafficSpool, admin_key: str = "adm"):
    """A SpecOPDClient whose HTTP goes to the spool through the route's own query parsing (admin key checked)."""
    from specopd_trainer.client.http import SpecOPDClient
    from sglang_specopd.wire.traffic import TRAFFIC_PATH, TRAFFIC_PURGE_PATH

    def handler(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {admin_key}":
            return httpx.Response(401, json={"error": "Unauthorized"})
        if request.url.path == TRAFFIC_PATH:
            try:
                q = parse_read_query(dict(request.url.params))
                return httpx.Response(200, content=spool.read(q["after"], q["max_items"], q["spool_id"]))
            except ValueError as exc:
                return httpx.Response(400, json={"error": {"message": str(exc)}})
        if request.url.path == TRAFFIC_PURGE_PATH:
            return httpx.Response(200, json={"purged": spool.purge(), "stats": spool.stats()})
        return httpx.Response(404, json={"error": {"message": "no route"}})

    def make(key):
        client = SpecOPDClient("http://spool", admin_api_key=key, retries=0)
        client._http = httpx.Client(transport=httpx.MockTransport(handler))
        return client

    return make


def test_client_traffic_and_purge_against_the_spool() -> None:
    from specopd_trainer.client.http import ServerRequestError

    spool = TrafficSpool(1 << 20, spool_id="a")
    for i in range(5):
        spool.add([i, 100 + i], 1, _trace(1, "v%d" % i), finished_at=float(i))
    make = _mock_client(spool)
    client = make("adm")
    first = client.traffic(3)
    assert [it["input_ids"] for it in first] == [[0, 100], [1, 101], [2, 102]]
    assert all(set(it) == {"input_ids", "prompt_len", "trace", "finished_at", "seq"} for it in first)
    assert [it["seq"] for it in first] == [1, 2, 3]
    assert first[1]["trace"] == [{"anchor": 10, "proposed": [1, 2, 3], "accepted": 0, "drafter_version": "v1"}]
    assert [it["finished_at"] for it in client.traffic(10)] == [3.0, 4.0]  # the rest, each once
    assert client.traffic(10) == [] and client.last_traffic.missed == 0
    spool.add([9, 9], 1, [])
    assert client.purge_traffic() == 6
    assert client.traffic(10) == [] and client.last_traffic.missed == 1  # the purged unread item
    for key in (None, "wrong"):
        with pytest.raises(ServerRequestError) as err:
            make(key).traffic(1)
        assert err.value.status == 401
        with pytest.raises(ServerRequestError):
            make(key).purge_traffic()
    with pytest.raises(ServerRequestError) as err:
        client.traffic(0)
    assert err.value.status == 400 and "max_items" in err.value.reason
