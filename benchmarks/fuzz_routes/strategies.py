"""Hypothesis strategies of the route fuzz (``benchmarks/fuzz_routes/run.py``, ``tests/test_fuzz_routes.py``).

One strategy per route (:data:`STRATEGIES`), each drawing :class:`Case` requests around a :class:`Target` (the
running server's vocabulary and serving drafter): near-valid bodies with wrong types, huge/negative ints, bad
safetensors, random dtypes/shapes/names/headers mixed in; and ``crafted``: the hostile kinds of
``benchmarks/fuzz_routes/crafted.py`` (deep nesting, huge and negative integers, NaN / Infinity, duplicate keys, truncated
bodies, wrong content types, slow and stalled bodies, early answers to ``Connection: close`` uploads) against every
route the plugin adds. ``Case.meta["kind"]`` names a crafted case's kind (the others count under their route).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict

import torch
from hypothesis import strategies as st

from sglang_specopd.wire.protocol import (
    ADMIN_KEY_HEADER,
    BINARY_CONTENT_TYPE,
    PREFIX_CACHE_PATH,
    SCORE_TREES_PATH,
    SWAP_DRAFTER_PATH,
    encode_tensors,
    tensors_digest,
)

ADMIN_KEY = "fuzz-admin"
# score_trees with or without the admin key: hidden states and features need it (401 without), the rest not
score_key = st.sampled_from([{}, {ADMIN_KEY_HEADER: ADMIN_KEY}])
# share of the examples per route (generation and swaps cost the most server time per example)
# (rollout, policy, traffic: fuzz_routes/admin_routes.py)
WEIGHTS = {"score_trees_json": 0.15, "score_trees_binary": 0.15, "swap": 0.14, "swap_no_key": 0.04,
           "prefix_cache": 0.07, "generate": 0.15, "crafted": 0.15, "rollout": 0.06, "policy": 0.04, "traffic": 0.05}
HUGE = [-2**63 - 1, -2**63, -1, 2**31, 2**63 - 1, 2**63, 2**64, 10**30]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.int64, torch.int32, torch.uint8, torch.bool]


@dataclass(frozen=True)
class Case:
    """One HTTP request: method, path, headers, body bytes; ``meta`` says what to check on the reply."""

    method: str
    path: str
    headers: Dict[str, str]
    body: bytes = b""
    meta: Dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """What the strategies need about the server: URL, vocabulary, the serving drafter's config and tensors."""

    url: str
    vocab_size: int
    drafter_config: dict
    drafter_tensors: Dict[str, torch.Tensor]
    drafter_dir: str
    target_dir: str
    model_name: str


# ---------------------------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------------------------

json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 70), st.sampled_from(HUGE),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6))
json_value = st.recursive(json_scalar, lambda c: st.one_of(st.lists(c, max_size=4),
                                                             st.dictionaries(st.text(max_size=6), c, max_size=4)),
                          max_leaves=12)
auth_headers = st.sampled_from([{}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_KEY},
                                {"Authorization": "Basic " + ADMIN_KEY}, {"Authorization": "Bearer"}])
admin = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _maybe(value_strategy, junk=json_value):
    """Mostly a value of ``value_strategy``, sometimes anything JSON (a wrong type)."""
    return st.one_of(value_strategy, value_strategy, value_strategy, junk)


def score_trees_json(t: Target):
    """Score_trees JSON bodies: near-valid requests with wrong types and huge ints mixed in, truncated, garbage."""
    tok = _maybe(st.one_of(st.integers(-2, t.vocab_size + 2), st.sampled_from(HUGE)))
    small = _maybe(st.integers(-2, 12))
    tree = st.one_of(
        st.fixed_dictionaries({"anchor": small, "branches": _maybe(st.lists(_maybe(st.lists(tok, max_size=5)),
                                                                            max_size=3))}),
        st.fixed_dictionaries({"anchor": small, "tokens": _maybe(st.lists(tok, max_size=6))},
                              optional={"parents": _maybe(st.lists(st.integers(-3, 7), max_size=6))}),
        json_value)
    ref = st.fixed_dictionaries({"input_ids": _maybe(st.lists(tok, max_size=12))},
                                optional={"trees": _maybe(st.lists(tree, max_size=3)), "junk": json_value})
    request = st.fixed_dictionaries(
        {"references": _maybe(st.lists(ref, max_size=3))},
        optional={"block_size": _maybe(st.integers(-1, 70)), "top_k": _maybe(st.sampled_from([-1, 0, 1, 5, 1025])),
                  "returns": _maybe(st.lists(st.sampled_from(["topk", "hidden", "logprobs", "x"]), max_size=3)),
                  "feature_layer_ids": _maybe(st.lists(st.integers(-2, 6), max_size=3)),
                  "output_dtype": _maybe(st.sampled_from(["float32", "bfloat16", "int8"]))})
    text = st.one_of(request.map(json.dumps), json_value.map(json.dumps), valid_score_request(t).map(json.dumps),
                     request.map(json.dumps).flatmap(lambda s: st.integers(0, len(s)).map(lambda n: s[:n])))
    body = st.one_of(text.map(str.encode), st.binary(max_size=200))
    ctype = st.sampled_from(["application/json", "application/json", "text/plain", ""])
    return st.builds(lambda b, c, k: Case("POST", SCORE_TREES_PATH, {**({"Content-Type": c} if c else {}), **k}, b,
                                          {"route": "score_trees"}), body, ctype, score_key)


@st.composite
def valid_score_request(draw, t: Target) -> dict:
    """A valid score_trees request (block size 4): random references, anchors, chains, trees and options, so that
    the fuzz also drives the scheduler's tree forward with random shapes."""
    ids = draw(st.lists(st.integers(0, t.vocab_size - 1), min_size=1, max_size=12))
    trees = []
    for anchor in draw(st.lists(st.integers(0, len(ids) - 1), max_size=3)):
        if draw(st.booleans()):
            trees.append({"anchor": anchor, "branches": draw(st.lists(st.lists(
                st.integers(0, t.vocab_size - 1), min_size=1, max_size=3), min_size=1, max_size=3))})
        else:  # a general tree: each node's parent is -1 or an earlier node of depth < 2 (paths <= 3 tokens)
            tokens, parents, depth = [], [], []
            for _ in range(draw(st.integers(0, 5))):
                options = [-1] + [i for i, d in enumerate(depth) if d < 2]
                parent = draw(st.sampled_from(options))
                tokens.append(draw(st.integers(0, t.vocab_size - 1)))
                parents.append(parent)
                depth.append(0 if parent == -1 else depth[parent] + 1)
            trees.append({"anchor": anchor, "tokens": tokens, "parents": parents})
    return {"references": [{"input_ids": ids, "trees": trees}], "block_size": 4,
            "returns": draw(st.lists(st.sampled_from(["topk", "hidden", "logprobs"]), min_size=1, max_size=3,
                                     unique=True)),
            "top_k": draw(st.integers(1, 8)), "feature_layer_ids": draw(st.sampled_from([[], [0], [0, 1]])),
            "output_dtype": draw(st.sampled_from(["float32", "bfloat16"]))}


def _tensor(names, dtypes, shapes):
    @st.composite
    def build(draw):
        name, dtype, shape = draw(names), draw(dtypes), draw(shapes)
        fill = draw(st.sampled_from([0.0, 1.0, -3.5, 7.0, float("nan"), float("inf")]))
        t = torch.full(shape, fill) if dtype.is_floating_point else torch.full(shape, 3, dtype=torch.int64)
        return name, (t > 0 if dtype == torch.bool else t.to(dtype))
    return build()


def _mutate(data: bytes):
    @st.composite
    def build(draw):
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
        return bytes(out[: draw(st.integers(0, len(out)))]) if draw(st.booleans()) else bytes(out)
    return build()


def score_trees_binary(t: Target):
    """Binary score_trees bodies: random tensors under the codec's names, random headers, mutated valid bodies."""
    names = st.sampled_from(["ref0.input_ids", "ref0.anchors", "ref0.node_tokens", "ref0.node_parents",
                             "ref0.node_anchor", "ref1.input_ids", "ref1.anchors", "x"])
    ints = st.sampled_from([torch.int64, torch.int64, torch.int32, torch.float32, torch.bool, torch.uint8])
    tensors = st.lists(_tensor(names, ints, st.sampled_from([(0,), (1,), (3,), (2, 2)])), min_size=1, max_size=7)
    header = _maybe(st.fixed_dictionaries({"num_references": _maybe(st.integers(-1, 3))},
                                          optional={"block_size": _maybe(st.integers(0, 70)),
                                                    "top_k": _maybe(st.integers(0, 5)), "junk": json_scalar}))
    valid = encode_tensors({f"ref0.{k}": torch.tensor(v) for k, v in (
        ("input_ids", [5, 6, 7, 8]), ("anchors", [1]), ("node_tokens", [9, 10]), ("node_parents", [-1, 0]),
        ("node_anchor", [0, 0]))}, {"num_references": 1, "block_size": 4})
    body = st.one_of(st.builds(lambda ts, h: _safetensors(dict(ts), h), tensors, header), _mutate(valid),
                     st.just(valid), st.binary(max_size=300))
    return st.builds(lambda b, k: Case("POST", SCORE_TREES_PATH, {"Content-Type": BINARY_CONTENT_TYPE, **k}, b,
                                       {"route": "score_trees"}), body, score_key)


def _safetensors(tensors: dict, header) -> bytes:
    """safetensors bytes whose specopd metadata is ``header`` as JSON (any JSON value, not only an object)."""
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in tensors.items()}, metadata={"specopd": json.dumps(header)})


def swap_bodies(t: Target):
    """Swap bodies around the serving drafter: its tensors with random dtype/shape/name/value changes and random
    config, version and checksum fields; mutated valid bodies; JSON path bodies; garbage."""
    good = dict(t.drafter_tensors)
    names = sorted(good)

    @st.composite
    def near_valid(draw):
        ts = dict(good)
        for _ in range(draw(st.integers(0, 2))):
            name = draw(st.sampled_from(names + ["extra.weight"]))
            kind = draw(st.sampled_from(["dtype", "shape", "drop", "value"]))
            base = ts.get(name, torch.zeros(2))
            if kind == "dtype":
                dtype = draw(st.sampled_from(DTYPES))
                ts[name] = base > 0 if dtype == torch.bool else base.to(dtype)
            elif kind == "shape":
                ts[name] = torch.zeros(*[max(1, d + draw(st.integers(-1, 1))) for d in base.shape])
            elif kind == "drop":
                ts.pop(name, None)
            else:
                v = base.clone().float()
                v.view(-1)[0] = draw(st.sampled_from([float("nan"), float("inf"), 1e30, 0.5]))
                ts[name] = v.to(base.dtype) if base.dtype.is_floating_point else v
        cfg = draw(st.one_of(st.just(t.drafter_config), st.just(t.drafter_config), st.just(t.drafter_config),
                             json_value, st.builds(lambda k, v: {**t.drafter_config, k: v},
                                                   st.sampled_from(sorted(t.drafter_config)), json_value)))
        digest = tensors_digest(ts)
        header = draw(st.fixed_dictionaries({}, optional={
            "config": st.just(cfg), "version": _maybe(st.text(min_size=1, max_size=8)),
            "sha256_of_tensors": st.sampled_from([digest, digest.upper(), "", "0" * 64, digest[:-1], 12345,
                                                  {"sha": digest}, None, [digest]]),
            "junk": json_scalar}))
        return _safetensors(ts, header) if draw(st.booleans()) else _safetensors(ts, draw(json_value))

    valid = encode_tensors(good, {"config": t.drafter_config, "sha256_of_tensors": tensors_digest(good)})
    path = st.sampled_from([t.drafter_dir, t.target_dir, t.drafter_dir + "/missing", "", "/", "a\x00b", "/proc"])
    path_body = st.fixed_dictionaries({"path": _maybe(path)}, optional={"version": _maybe(st.text(max_size=5)),
                                                                        "junk": json_scalar})
    return st.one_of(near_valid(), _mutate(valid), path_body.map(lambda d: json.dumps(d).encode()),
                     json_value.map(lambda v: json.dumps(v).encode()), st.binary(max_size=200))


def swap(t: Target):
    return st.builds(lambda b: Case("POST", SWAP_DRAFTER_PATH, admin, b, {"route": "swap"}), swap_bodies(t))


def swap_no_key(t: Target):
    return st.builds(lambda b, h: Case("POST", SWAP_DRAFTER_PATH, h, b, {"route": "swap", "unauthorised": True}),
                     swap_bodies(t), auth_headers)


def prefix_cache(t: Target):
    """Stats (GET, any body/query) and clear (POST, with the key, without it or with a wrong one)."""
    stats = st.builds(lambda b, q: Case("GET", PREFIX_CACHE_PATH + q, {}, b, {"route": "prefix_cache"}),
                      st.binary(max_size=20), st.sampled_from(["", "?x=1", "?clear=1"]))
    clear = st.builds(lambda b, h: Case("POST", PREFIX_CACHE_PATH + "/clear", h, b,
                                        {"route": "prefix_cache", "unauthorised": h != admin}),
                      st.binary(max_size=20), st.one_of(st.just(admin), auth_headers))
    return st.one_of(stats, clear)


def generate(t: Target):
    """/generate and /v1/completions (greedy, 1-3 tokens) with random ``custom_params`` and trace values."""
    trace = st.one_of(st.booleans(), json_value, st.sampled_from(["false", "true", 0, 1, "", [], {}]))
    params = st.one_of(st.fixed_dictionaries({"specopd_trace": trace}, optional={"junk": json_scalar}),
                       st.fixed_dictionaries({}, optional={"specopd_trace": trace}), json_value)
    prompt = st.text(max_size=20)

    def native(p, cp, n):
        body = {"text": p or "x", "sampling_params": {"temperature": 0.0, "max_new_tokens": n, "custom_params": cp}}
        return Case("POST", "/generate", {"Content-Type": "application/json"}, json.dumps(body).encode(),
                    {"route": "generate", "trace": cp.get("specopd_trace") if isinstance(cp, dict) else None})

    def openai(p, cp, n):
        body = {"model": t.model_name, "prompt": p or "x", "max_tokens": n, "temperature": 0.0,
                "custom_params": cp, "return_meta_info": True}
        return Case("POST", "/v1/completions", {"Content-Type": "application/json"}, json.dumps(body).encode(),
                    {"route": "generate"})

    n = st.integers(1, 3)
    return st.one_of(st.builds(native, prompt, params, n), st.builds(openai, prompt, params, n))


# The route strategies; the runner (:mod:`fuzz_routes.run`) adds ``"crafted"`` (:mod:`fuzz_routes.crafted`, which
# imports this module: one direction only, no import cycle).
STRATEGIES = {"score_trees_json": score_trees_json, "score_trees_binary": score_trees_binary, "swap": swap,
              "swap_no_key": swap_no_key, "prefix_cache": prefix_cache, "generate": generate}
