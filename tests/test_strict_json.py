"""Strict, bounded JSON for client bodies (``sglang_specopd.wire.strict_json``) and the public drafter view (no
server)."""

from __future__ import annotations

import json
import random

import pytest

from sglang_specopd.server.drafter.routes import public_drafter_info, swap_json_problem
from sglang_specopd.wire.strict_json import MAX_JSON_DEPTH, JSONBodyError, loads, nesting_depth


@pytest.mark.parametrize("text,depth", [
    ("", 0), ("-1", 0), ("[]", 1), ("[[[]]]", 3), ('{"a": [1, {"b": []}]}', 4),
    ('"[[[["', 0),  # brackets in a string
    (r'["\\", [[]]]', 3),  # an escaped backslash ends before the quote: the string closes there
    (r'["\"[[[", 1]', 1),  # an escaped quote does not close the string
    (r'["\\\"[[", 1]', 1),  # three backslashes: an escaped backslash, then an escaped quote
    ("]]][[", 2),  # stray closers in invalid JSON do not hide the depth after them
])
def test_nesting_depth(text: str, depth: int) -> None:
    assert nesting_depth(text.encode()) == depth


def test_nesting_depth_equals_a_reference_walk_on_random_json() -> None:
    rng = random.Random(0)

    def value(d):
        r = rng.random()
        if d > 6 or r < 0.3:
            return rng.choice([1, -2.5, None, True, 'a"b\\', "[{", "\\\\", "x\\\"]"])
        if r < 0.65:
            return [value(d + 1) for _ in range(rng.randrange(3))]
        return {rng.choice(["k", "[", "\\\"{"]) + str(i): value(d + 1) for i in range(rng.randrange(3))}

    def depth(v):
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    for _ in range(300):
        v = value(0)
        assert nesting_depth(json.dumps(v).encode()) == depth(v), json.dumps(v)


@pytest.mark.parametrize("body,reason", [
    (b"[" * 3000, f"nested 3000 levels deep; the limit is {MAX_JSON_DEPTH}"),
    (b'{"a": ' * 40 + b"1" + b"}" * 40, "nested 40 levels deep"),
    (b"[NaN]", "NaN is not allowed"), (b'{"x": -Infinity}', "-Infinity is not allowed"),
    (b'{"a": 1, "b": {"c": 2, "c": 3}}', "duplicate key 'c'"),
    (b'{"a": [1, 2', "not valid JSON"), (b"", "not valid JSON"), (b"\xff", "not UTF-8"),
    (b"[" + b"7" * 5000 + b"]", "not valid JSON"),  # Python's 4,300-digit limit on int conversion
])
def test_loads_refuses_with_the_reason(body: bytes, reason: str) -> None:
    with pytest.raises(JSONBodyError, match=reason):
        loads(body)


def test_loads_takes_what_json_takes_within_bounds() -> None:
    doc = {"references": [{"input_ids": [2**63, -1, 0], "trees": [{"anchor": 1, "branches": [[1, 2]]}]}],
           "s": "[{\"\\", "f": 1e308, "u": "\u00e9"}
    assert loads(json.dumps(doc).encode()) == doc
    assert loads(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH) is not None
    assert loads('{"a": 1}', what="x") == {"a": 1}
    with pytest.raises(JSONBodyError, match="^the header is JSON nested 3 levels deep; the limit is 2$"):
        loads(b"[[[]]]", max_depth=2, what="the header")


def test_drafter_views_and_swap_bodies() -> None:
    info = {"version": "v3", "swaps": 2, "has_drafter": True, "path": "/srv/drafters/b8-run7", "arch": "dflash",
            "spec": {"block_size": 8}}
    public = public_drafter_info(info)
    assert public == {"version": "v3", "swaps": 2, "has_drafter": True, "name": "b8-run7", "arch": "dflash",
                      "spec": {"block_size": 8}}
    assert public_drafter_info({"version": "initial", "swaps": 0, "has_drafter": False}) == {
        "version": "initial", "swaps": 0, "has_drafter": False}
    assert swap_json_problem(b'{"path": "/d", "version": "v"}') is None
    assert swap_json_problem(b"\x08\x00\x00\x00{") is None  # safetensors bytes: checked by the swap op
    assert "duplicate key 'path'" in swap_json_problem(b'{"path": "/a", "path": "/b"}')
    assert "nested" in swap_json_problem(b'{"a": ' * 100)
