"""Crafted hostile requests for the route fuzz (``benchmarks/fuzz_routes/run.py``, ``tests/test_fuzz_routes.py``).

The :func:`crafted` strategy draws one of the kinds below (``Case.meta["kind"]``, counted per kind in the result
file) against every route the plugin adds, with and without keep-alive (``Connection: close``):

* ``deep_nesting``: ``[[[[...`` / ``{"a": {"a": ...`` a few dozen to 20,000 levels deep, bare or behind a valid
  prefix (issue 41: a few thousand ``[`` made score_trees answer 500 and reset the next request);
* ``huge_ints`` / ``negative_ints``: out-of-range integers in every numeric field of score_trees (JSON and the
  binary header), the swap body and the traffic query;
* ``nan_infinity``: ``NaN``, ``Infinity``, ``-Infinity`` literals where numbers go;
* ``duplicate_keys``: the same key twice in one object;
* ``truncated``: valid bodies cut anywhere (Content-Length honest);
* ``wrong_content_type``: valid JSON as octet-stream, binary as JSON, form / multipart / garbage types;
* ``slow_body``: a valid body sent in pieces with pauses below the server's idle limit (must be answered as if
  sent at once);
* ``stalled_body``: part of a body, then a pause past the server's idle limit (``SPECOPD_BODY_IDLE_S``): 408;
* ``early_close``: a ``Connection: close`` upload over the payload limit, or without the admin key (answered
  before the body is read: the answer must arrive, not a reset).

A Case's ``meta["slow"]`` (list of ``(bytes, pause_s)``) tells the sender to stream the body that way.
"""

from __future__ import annotations

import json
from typing import Callable, Dict

from hypothesis import strategies as st

from sglang_specopd.wire.protocol import (ADMIN_KEY_HEADER, BINARY_CONTENT_TYPE, PREFIX_CACHE_PATH, SCORE_TREES_PATH,
                                         SWAP_DRAFTER_PATH)
from sglang_specopd.wire.traffic import TRAFFIC_PATH

ADMIN_KEY = "fuzz-admin"  # the same key as fuzz_routes.strategies (the test server's admin key)
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
JSON = {"Content-Type": "application/json"}
HUGE = [2**31, 2**63 - 1, 2**63, 2**64, 10**30, 10**300]
NEGATIVE = [-1, -2, -(2**31), -(2**63), -(2**63) - 1, -(10**30)]
CONSTANTS = ["NaN", "Infinity", "-Infinity"]
BODY_IDLE_S = 3.0  # the fuzz server's SPECOPD_BODY_IDLE_S (fuzz_routes.fuzz_launch_spec; tests/conftest.py)
PAYLOAD_LIMIT = 1_000_000  # the fuzz server's SPECOPD_MAX_PAYLOAD_BYTES


def _valid_score(vocab: int) -> dict:
    return {"references": [{"input_ids": [5, 6, 7, 8, 9], "trees": [{"anchor": 2, "branches": [[10, 11], [12]]},
                                                                       {"anchor": 3, "tokens": [13, 14],
                                                                        "parents": [-1, 0]}]}],
            "block_size": 4, "returns": ["topk"], "top_k": 3, "feature_layer_ids": [0]}


def _case(path, headers, body, kind, method="POST", **meta):
    from fuzz_routes.strategies import Case  # the dataclass lives there (one definition, imported by the runner)

    route = "swap" if path == SWAP_DRAFTER_PATH else "score_trees" if path == SCORE_TREES_PATH else "control"
    if route == "score_trees":  # with the admin key: the crafted body, not the hidden/features check, is under test
        headers = {**headers, ADMIN_KEY_HEADER: ADMIN_KEY}
    return Case(method, path, dict(headers), body, {"route": route, "kind": kind, **meta})


def _close(draw, headers: dict) -> dict:
    return {**headers, "Connection": "close"} if draw(st.booleans()) else dict(headers)


@st.composite
def deep_nesting(draw, t):
    n = draw(st.one_of(st.integers(33, 200), st.integers(900, 1100), st.integers(2000, 20000)))
    opener = draw(st.sampled_from([b"[", b'{"a": ', b'[{"a": ']))
    closer = {b"[": b"]", b'{"a": ': b"}", b'[{"a": ': b"}]"}[opener] if draw(st.booleans()) else b""
    prefix = draw(st.sampled_from([b"", b'{"references": ', b'{"path": ', b'{"block_size": 4, "references": [']))
    body = prefix + opener * n + b"1" + closer * n
    path, headers = draw(st.sampled_from([(SCORE_TREES_PATH, JSON), (SWAP_DRAFTER_PATH, ADMIN),
                                          (SCORE_TREES_PATH, {"Content-Type": BINARY_CONTENT_TYPE})]))
    return _case(path, _close(draw, headers), body, "deep_nesting")


def _numbers(draw, t, pool):
    """A valid score_trees request with one numeric field replaced by a value of ``pool``."""
    req = _valid_score(t.vocab_size)
    value = draw(st.sampled_from(pool))
    where = draw(st.sampled_from(["input_ids", "anchor", "branch", "tokens", "parents", "block_size", "top_k",
                                  "feature_layer_ids"]))
    ref, tree = req["references"][0], req["references"][0]["trees"]
    if where == "input_ids":
        ref["input_ids"][draw(st.integers(0, 4))] = value
    elif where == "anchor":
        tree[draw(st.integers(0, 1))]["anchor"] = value
    elif where == "branch":
        tree[0]["branches"][0][0] = value
    elif where == "tokens":
        tree[1]["tokens"][1] = value
    elif where == "parents":
        tree[1]["parents"][1] = value
    elif where == "feature_layer_ids":
        req["feature_layer_ids"] = [value]
    else:
        req[where] = value
    return req


@st.composite
def huge_ints(draw, t):
    return _int_case(draw, t, HUGE, "huge_ints")


@st.composite
def negative_ints(draw, t):
    return _int_case(draw, t, NEGATIVE, "negative_ints")


def _int_case(draw, t, pool, kind):
    target = draw(st.sampled_from(["score_json", "score_binary", "swap", "traffic"]))
    if target == "score_json":
        return _case(SCORE_TREES_PATH, JSON, json.dumps(_numbers(draw, t, pool)).encode(), kind)
    if target == "score_binary":
        from fuzz_routes.strategies import _safetensors

        import torch

        header = {"num_references": draw(st.sampled_from(pool + [1])), "block_size": draw(st.sampled_from(pool + [4])),
                  "top_k": draw(st.sampled_from(pool + [3]))}
        tensors = {f"ref0.{k}": torch.tensor(v) for k, v in (("input_ids", [5, 6, 7]), ("anchors", [1]),
                                                              ("node_tokens", [9]), ("node_parents", [-1]),
                                                              ("node_anchor", [0]))}
        return _case(SCORE_TREES_PATH, {"Content-Type": BINARY_CONTENT_TYPE}, _safetensors(tensors, header), kind)
    if target == "swap":
        body = {"path": t.drafter_dir, "version": draw(st.sampled_from(pool))}
        return _case(SWAP_DRAFTER_PATH, ADMIN, json.dumps(body).encode(), kind)
    q = "&".join(f"{k}={draw(st.sampled_from(pool))}" for k in draw(st.sets(st.sampled_from(["after", "max_items"]),
                                                                              min_size=1)))
    return _case(TRAFFIC_PATH + "?" + q, ADMIN, b"", kind, method="GET")


@st.composite
def nan_infinity(draw, t):
    """A valid request (random shape) with one of its numbers replaced by NaN / Infinity / -Infinity."""
    import re

    from fuzz_routes.strategies import valid_score_request

    const = draw(st.sampled_from(CONSTANTS))
    if draw(st.integers(0, 4)) == 0:
        body = json.dumps({"path": t.drafter_dir, "version": "v"})[:-1] + f', "x": {const}}}'
        return _case(SWAP_DRAFTER_PATH, ADMIN, body.encode(), "nan_infinity")
    text = json.dumps(draw(valid_score_request(t)))
    numbers = [m.span() for m in re.finditer(r"(?<=[\[:,\s])-?\d+(?=[,\]}])", text)]
    start, end = numbers[draw(st.integers(0, len(numbers) - 1))]
    return _case(SCORE_TREES_PATH, JSON, (text[:start] + const + text[end:]).encode(), "nan_infinity")


@st.composite
def duplicate_keys(draw, t):
    """A valid request with one key given twice (top level, in a reference or in a tree), the second value random."""
    from fuzz_routes.strategies import json_scalar, valid_score_request

    extra = json.dumps(draw(st.one_of(json_scalar, st.just([]), st.just({}))))
    if draw(st.integers(0, 3)) == 0:
        key = draw(st.sampled_from(["path", "version"]))
        body = json.dumps({"path": t.drafter_dir, "version": "dup"})[:-1] + f', "{key}": {extra}}}'
        return _case(SWAP_DRAFTER_PATH, ADMIN, body.encode(), "duplicate_keys")
    req = draw(valid_score_request(t))
    where = draw(st.sampled_from(["top", "reference", "tree"]))
    if where == "tree" and req["references"][0]["trees"]:
        tree = req["references"][0]["trees"][0]
        key = draw(st.sampled_from(sorted(tree)))
        text = json.dumps(tree)
        req["references"][0]["trees"][0] = "@TREE@"
        body = json.dumps(req).replace('"@TREE@"', text[:-1] + f', "{key}": {extra}}}')
    elif where == "reference":
        key = draw(st.sampled_from(["input_ids", "trees"]))
        text = json.dumps(req["references"][0])
        req["references"][0] = "@REF@"
        body = json.dumps(req).replace('"@REF@"', text[:-1] + f', "{key}": {extra}}}')
    else:
        key = draw(st.sampled_from(sorted(req)))
        body = json.dumps(req)[:-1] + f', "{key}": {extra}}}'
    return _case(SCORE_TREES_PATH, JSON, body.encode(), "duplicate_keys")


@st.composite
def truncated(draw, t):
    from fuzz_routes.strategies import valid_score_request

    from sglang_specopd.wire.protocol import ScoreTreesRequest, request_to_binary

    req = draw(valid_score_request(t))
    if draw(st.booleans()):
        full, headers = json.dumps(req).encode(), JSON
    else:
        full, headers = request_to_binary(ScoreTreesRequest.model_validate(req)), {"Content-Type": BINARY_CONTENT_TYPE}
    cut = draw(st.integers(0, max(0, len(full) - 1)))
    return _case(SCORE_TREES_PATH, _close(draw, headers), full[:cut], "truncated")


@st.composite
def wrong_content_type(draw, t):
    from fuzz_routes.strategies import valid_score_request

    from sglang_specopd.wire.protocol import ScoreTreesRequest, request_to_binary

    req = draw(valid_score_request(t))
    as_json = json.dumps(req).encode()
    body = draw(st.sampled_from([as_json, request_to_binary(ScoreTreesRequest.model_validate(req))]))
    ctype = draw(st.sampled_from([BINARY_CONTENT_TYPE, "application/json", "application/x-www-form-urlencoded",
                                  "multipart/form-data; boundary=x", "text/html", "application/json; charset=latin-1",
                                  "application/ json;;=", "application/octet-stream; q=0", "*/*"]))
    path, headers = draw(st.sampled_from([(SCORE_TREES_PATH, {}), (SWAP_DRAFTER_PATH, ADMIN)]))
    return _case(path, {**headers, "Content-Type": ctype}, body, "wrong_content_type")


@st.composite
def slow_body(draw, t):
    from fuzz_routes.strategies import valid_score_request

    body = json.dumps(draw(valid_score_request(t))).encode()
    pieces = draw(st.integers(2, 5))
    step = max(1, len(body) // pieces)
    chunks = [body[i:i + step] for i in range(0, len(body), step)]
    slow = [(len(c), draw(st.sampled_from([0.0, 0.05, 0.2, 0.5]))) for c in chunks]
    return _case(SCORE_TREES_PATH, _close(draw, JSON), body, "slow_body", slow=slow)


@st.composite
def stalled_body(draw, t):
    from fuzz_routes.strategies import valid_score_request

    body = json.dumps(draw(valid_score_request(t))).encode()
    first = draw(st.integers(0, len(body) - 1))
    path, headers = draw(st.sampled_from([(SCORE_TREES_PATH, JSON), (SWAP_DRAFTER_PATH, ADMIN)]))
    return _case(path, headers, body, "stalled_body", slow=[(first, 0.0), (len(body) - first, BODY_IDLE_S + 1.0)],
                 expect=408)


@st.composite
def early_close(draw, t):
    size = draw(st.integers(PAYLOAD_LIMIT + 1, 4 * PAYLOAD_LIMIT))
    body = b"[" + b"1," * (size // 2) + b"1]"
    path, headers = draw(st.sampled_from([(SCORE_TREES_PATH, JSON), (SWAP_DRAFTER_PATH, ADMIN),
                                          (SWAP_DRAFTER_PATH, {}), (PREFIX_CACHE_PATH + "/clear", {})]))
    return _case(path, {**headers, "Connection": "close"}, body, "early_close",
                 unauthorised=not headers and path != SCORE_TREES_PATH)


KINDS: Dict[str, Callable] = {
    "deep_nesting": deep_nesting, "huge_ints": huge_ints, "negative_ints": negative_ints,
    "nan_infinity": nan_infinity, "duplicate_keys": duplicate_keys, "truncated": truncated,
    "wrong_content_type": wrong_content_type, "slow_body": slow_body, "stalled_body": stalled_body,
    "early_close": early_close,
}
# share of the crafted examples per kind: a stalled body costs the server's idle limit (3 s), so few of those
KIND_WEIGHTS = {"deep_nesting": 6, "huge_ints": 3, "negative_ints": 3, "nan_infinity": 3, "duplicate_keys": 3,
                "truncated": 4, "wrong_content_type": 3, "slow_body": 2, "stalled_body": 0.2, "early_close": 1}


def crafted(t):
    """One crafted case of any kind, the kinds drawn by :data:`KIND_WEIGHTS` (hypothesis has no weights: each
    kind is repeated in a sampled list proportionally)."""
    slots = []
    for kind, w in KIND_WEIGHTS.items():
        slots += [kind] * max(1, round(w * 5))
    return st.sampled_from(slots).flatmap(lambda k: KINDS[k](t))
