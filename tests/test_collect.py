"""Response regeneration into the JSONL cache (trainer/specopd_trainer/collect.py): real tiny SPECOPD server + stub servers.

The tiny SGLang server is conftest's ``tiny_specopd_server``
(the shared ``tiny_admin_server``, ``tests/_servers.py``): ``test_evaluate.py``, ``test_serve_tiny.py`` and the
admin-server modules use the same one, so they together pay for one server start. Failures in the middle of a run are simulated with a stub HTTP server, never by
killing SGLang.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Tuple

import pytest

from fakes.http_stub import make_records, stub_server

# ----------------------------------------------------------------------------------------------------------------
# Against the real tiny server
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.server
def test_regenerate_then_resume_after_torn_last_line(tiny_specopd_server, tiny_tokenizer, tmp_path: Path) -> None:
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.collect import chat_prompt_ids, iter_responses, regenerate

    records = make_records(6)
    cache = tmp_path / "responses.jsonl"
    with SpecOPDClient(tiny_specopd_server.url, retries=1, backoff_s=0.1) as client:
        res = regenerate(client, tiny_tokenizer, iter(records), cache, max_new_tokens=16, concurrency=4)
        assert (res.new, res.cached, res.resumed, res.too_long, res.rejected) == (6, 6, 0, 0, 0)
        first = {r.id: r for r in iter_responses(cache)}
        assert sorted(first) == [r["id"] for r in records]
        for rec in records:
            got = first[rec["id"]]
            assert got.domain == rec["domain"]
            assert list(got.prompt_ids) == chat_prompt_ids(tiny_tokenizer, rec["messages"])
            assert 1 <= len(got.response_ids) <= 16 and got.finish_reason in ("length", "stop")
        assert res.prompt_tokens == sum(len(r.prompt_ids) for r in first.values())
        assert res.response_tokens == sum(len(r.response_ids) for r in first.values()) and res.tokens_per_s > 0
        # Greedy: the cached response is what the server answers for that prompt alone.
        alone = client.generate(list(first["r0"].prompt_ids), max_new_tokens=16, temperature=0.0)
        assert tuple(alone["output_ids"]) == first["r0"].response_ids

        # A crash mid-write leaves a torn last line: it is ignored on read and regenerated on resume.
        lines = cache.read_bytes().splitlines(keepends=True)
        torn_id = json.loads(lines[-1])["id"]
        cache.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
        assert [r.id for r in iter_responses(cache)] == [json.loads(x)["id"] for x in lines[:-1]]
        res2 = regenerate(client, tiny_tokenizer, records, cache, max_new_tokens=16, concurrency=4, progress=False)
    assert (res2.new, res2.resumed, res2.cached) == (1, 5, 6)
    again = {r.id: r for r in iter_responses(cache)}
    assert again == first and len(cache.read_bytes().splitlines()) == 6
    assert json.loads(cache.read_bytes().splitlines()[-1])["id"] == torn_id


@pytest.mark.server
def test_too_long_prompt_is_skipped_and_counted(tiny_specopd_server, tiny_tokenizer, tmp_path: Path) -> None:
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.collect import chat_prompt_ids, iter_responses, regenerate

    records = make_records(2, prefix="short")
    long_rec = {"id": "long", "domain": "coding",
                "messages": [{"role": "user", "content": "Return the sum of the arguments. " * 20}]}
    limit = max(len(chat_prompt_ids(tiny_tokenizer, r["messages"])) for r in records)
    assert len(chat_prompt_ids(tiny_tokenizer, long_rec["messages"])) > limit
    cache = tmp_path / "c.jsonl"
    with SpecOPDClient(tiny_specopd_server.url) as client:
        res = regenerate(client, tiny_tokenizer, [records[0], long_rec, records[1]], cache, max_new_tokens=8,
                         max_prompt_tokens=limit, concurrency=2, progress=False)
    assert (res.new, res.too_long, res.too_long_ids, res.cached) == (2, 1, ("long",), 2)
    assert sorted(r.id for r in iter_responses(cache)) == ["short0", "short1"]


# ----------------------------------------------------------------------------------------------------------------
# Failures (stub servers / nothing listening)
# ----------------------------------------------------------------------------------------------------------------


def test_server_down_raises_collection_error_and_keeps_cache(tiny_tokenizer, tmp_path: Path) -> None:
    from sglang_specopd.app.launch.process import free_port
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.collect import CollectionError, regenerate

    cache = tmp_path / "c.jsonl"
    kept = [{"id": "r0", "domain": "math", "prompt_ids": [1, 2], "response_ids": [5, 6, 2], "finish_reason": "stop"},
            {"id": "r1", "domain": "math", "prompt_ids": [1, 3], "response_ids": [7], "finish_reason": "length"}]
    cache.write_text("".join(json.dumps(k) + "\n" for k in kept))
    before = cache.read_bytes()
    with SpecOPDClient(f"http://127.0.0.1:{free_port()}", retries=1, backoff_s=0.01) as client:
        with pytest.raises(CollectionError, match=r"2 responses are cached .*re-running the same command resumes"):
            regenerate(client, tiny_tokenizer, make_records(5), cache, max_new_tokens=8, progress=False)
    assert cache.read_bytes() == before


def test_server_dying_mid_run_keeps_finished_responses(tiny_tokenizer, tmp_path: Path) -> None:
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.collect import CollectionError, iter_responses, regenerate

    served = []
    lock = threading.Lock()

    def handler(path: str, body: dict) -> Tuple[int, dict]:
        with lock:
            if len(served) >= 3:
                return 503, {"message": "server shutting down"}
            served.append(body["input_ids"])
        return 200, {"output_ids": [40, 41, 2], "meta_info": {"finish_reason": {"type": "stop"}}}

    cache = tmp_path / "c.jsonl"
    with stub_server(handler) as url, SpecOPDClient(url, retries=2, backoff_s=0.01) as client:
        with pytest.raises(CollectionError) as err:
            regenerate(client, tiny_tokenizer, make_records(8), cache, max_new_tokens=8, concurrency=1,
                       progress=False)
    assert (err.value.cached, err.value.new) == (3, 3)
    got = list(iter_responses(cache))
    assert [r.id for r in got] == ["r0", "r1", "r2"] and all(r.response_ids == (40, 41, 2) for r in got)
    assert [list(r.prompt_ids) for r in got] == served


def test_4xx_is_counted_and_auth_failure_is_fatal(tiny_tokenizer, tmp_path: Path) -> None:
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.collect import CollectionError, regenerate

    bad_len = None

    def handler(path: str, body: dict) -> Tuple[int, dict]:
        if len(body["input_ids"]) == bad_len:
            return 400, {"error": {"message": "input too long for the context"}}
        return 200, {"output_ids": [9], "meta_info": {"finish_reason": {"type": "length"}}}

    from specopd_trainer.collect import chat_prompt_ids

    records = make_records(3)
    records[1]["messages"][0]["content"] = "A distinctly longer request with many more words in it, surely."
    bad_len = len(chat_prompt_ids(tiny_tokenizer, records[1]["messages"]))
    assert bad_len not in {len(chat_prompt_ids(tiny_tokenizer, r["messages"])) for r in (records[0], records[2])}
    with stub_server(handler) as url, SpecOPDClient(url, retries=0) as client:
        res = regenerate(client, tiny_tokenizer, records, tmp_path / "a.jsonl", max_new_tokens=1, progress=False)
    assert (res.new, res.rejected) == (2, 1) and "input too long" in res.rejected_reasons[0]

    with stub_server(lambda p, b: (401, {"message": "bad api key"})) as url, SpecOPDClient(url, retries=0) as client:
        with pytest.raises(CollectionError, match="bad api key"):
            regenerate(client, tiny_tokenizer, records, tmp_path / "b.jsonl", max_new_tokens=1, progress=False)


# ----------------------------------------------------------------------------------------------------------------
# The cache format
# ----------------------------------------------------------------------------------------------------------------


def test_cache_reader_tolerates_only_a_torn_tail(tmp_path: Path) -> None:
    from specopd_trainer.collect import CacheFormatError, cached_ids, iter_responses, repair_cache

    line = json.dumps({"id": "a", "domain": "coding", "prompt_ids": [1], "response_ids": [2, 3],
                       "finish_reason": "length"})
    cache = tmp_path / "c.jsonl"
    assert list(iter_responses(cache)) == [] and repair_cache(cache) == 0
    cache.write_text(line + "\n" + line.replace('"a"', '"b"')[:17])
    assert [r.id for r in iter_responses(cache)] == ["a"] and cached_ids(cache) == {"a"}
    assert list(iter_responses(cache))[0].response_ids == (2, 3)
    assert repair_cache(cache) == 17 and cache.read_text() == line + "\n"
    cache.write_text(line + "\n{not json\n" + line + "\n")
    with pytest.raises(CacheFormatError, match=r"c\.jsonl:2"):
        list(iter_responses(cache))


def test_invalid_record_is_a_typed_error(tiny_tokenizer, tmp_path: Path) -> None:
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.collect import InvalidRecordError, regenerate

    with SpecOPDClient("http://127.0.0.1:9", retries=0) as client, pytest.raises(InvalidRecordError, match="'id'"):
        regenerate(client, tiny_tokenizer, [{"messages": [{"role": "user", "content": "x"}]}], tmp_path / "c.jsonl",
                   progress=False)


def test_a_record_may_carry_its_own_temperature_and_seed(tiny_tokenizer, tmp_path: Path) -> None:
    """Several samples of one prompt (data/corpus.py): the record's temperature and sampling_seed reach /generate;
    records without them get the run's temperature."""
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.collect import regenerate

    seen = {}

    def handler(path: str, body: dict) -> Tuple[int, dict]:
        sp = body["sampling_params"]
        seen[(sp["temperature"], sp.get("sampling_seed"))] = True
        return 200, {"output_ids": [5, 6], "meta_info": {"finish_reason": {"type": "stop"}}}

    base = make_records(1)[0]
    records = [base, {**base, "id": base["id"] + "#s1", "temperature": 0.8, "sampling_seed": 1},
               {**base, "id": base["id"] + "#s2", "temperature": 0.8, "sampling_seed": 2}]
    with stub_server(handler) as url, SpecOPDClient(url, retries=0) as client:
        res = regenerate(client, tiny_tokenizer, records, tmp_path / "a.jsonl", max_new_tokens=2, temperature=0.0,
                         progress=False, concurrency=1)
    assert res.new == 3
    assert set(seen) == {(0.0, None), (0.8, 1), (0.8, 2)}
