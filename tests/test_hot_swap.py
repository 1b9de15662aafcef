"""Hot swap of the serving drafter (``POST /specopd/drafter/swap``, admin) on a real SGLang server.

The server is the one of ``test_score_trees.py`` (:func:`test_score_trees.shared_server`): tiny fp32 target,
SPECOPD with a random block-4 drafter, ``--admin-api-key``. The second drafter has the same spec with its
weights scaled up, so that its greedy proposals differ (a random drafter at the usual 0.02 init proposes the mask
token everywhere). Whatever drafter serves, the greedy OUTPUT is the target's (it verifies every token).

``apply_swap``'s rollback cannot be triggered from outside (validation catches every bad payload before any
weight changes), so it is unit-tested with a fake worker whose ``load_weights`` fails half-way.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Dict, List

import httpx
import pytest
import torch

from sglang_specopd.wire.protocol import (DRAFTER_ADMIN_INFO_PATH, DRAFTER_INFO_PATH, SWAP_DRAFTER_PATH,
                                          encode_tensors, swap_payload, tensors_digest)
from support.score_trees import ADMIN_KEY, MAX_PAYLOAD, NEW_TOKENS, PROMPTS, Shared, shared_server  # noqa: F401

VERSIONS_KEY = "specopd_drafter_versions"
TRACE_KEY = "specopd_trace"
PROBE_PROMPT = "A fresh prompt for probing the drafter."
PROBE_TOKENS = 6
CONCURRENT_TOKENS = 8  # greedy: the first tokens of the NEW_TOKENS reference


def load_drafter(path: Path):
    from safetensors.torch import load_file

    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


def info(shared: Shared) -> dict:
    """The admin view of the serving drafter (with its checkpoint path; the public one has none)."""
    r = httpx.get(shared.url + DRAFTER_ADMIN_INFO_PATH, headers=shared.admin_headers, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def swap(shared: Shared, body: bytes, *, headers=None, timeout: float = 120.0) -> httpx.Response:
    headers = shared.admin_headers if headers is None else headers
    return httpx.post(shared.url + SWAP_DRAFTER_PATH, content=body, headers=headers, timeout=timeout)


def swap_ok(shared: Shared, body: bytes) -> dict:
    before = info(shared)
    r = swap(shared, body)
    assert r.status_code == 200, r.text[:500]
    out = r.json()
    assert out["previous_version"] == before["version"] and out["swaps"] == before["swaps"] + 1
    # idle (the info call above let the scheduler finish an empty iteration): the radix cache is flushed
    assert out["cache_flushed"] is True
    assert info(shared)["version"] == out["version"]
    return out


def scaled_payload(shared: Shared, version: str) -> bytes:
    config, tensors = load_drafter(shared.scaled_drafter)
    return swap_payload(config, tensors, version)


def path_body(path: Path, version: str = None) -> bytes:
    return json.dumps({"path": str(path), **({"version": version} if version else {})}).encode()


def flush_cache(shared: Shared) -> None:
    r = httpx.post(shared.url + "/flush_cache", headers=shared.admin_headers, timeout=60)
    assert r.status_code == 200, r.text


def probe(shared: Shared, prompt: str = PROBE_PROMPT, *, flush: bool = True) -> dict:
    """One greedy traced request; the drafter's proposals, versions and output. ``flush``: empty the radix cache
    first, so no draft KV computed by an earlier drafter is reused."""
    if flush:
        flush_cache(shared)
    resp = shared.srv.generate(prompt, PROBE_TOKENS, trace=True)
    meta = resp["meta_info"]
    # each verify record names the drafter that proposed it: one of the versions the request lists, in order
    steps = [r["drafter_version"] for r in meta[TRACE_KEY]]
    assert steps and [v for i, v in enumerate(steps) if i == 0 or steps[i - 1] != v] == meta[VERSIONS_KEY], steps
    # "trace": the records without their version, so that the same weights under two names compare equal
    return {"output": resp["output_ids"], "versions": meta[VERSIONS_KEY],
            "trace": [{k: v for k, v in r.items() if k != "drafter_version"} for r in meta[TRACE_KEY]],
            "proposed": [r["proposed"] for r in meta[TRACE_KEY]]}


@pytest.fixture(scope="module")
def baselines(shared_server: Shared) -> Dict[str, dict]:
    """Probes under the initial and the scaled drafter (the server is left serving the initial weights)."""
    shared = shared_server
    if info(shared)["swaps"]:
        swap_ok(shared, path_body(shared.drafter, "initial-again"))
    initial = probe(shared)
    assert initial["output"] == probe(shared)["output"], "greedy output must be deterministic"
    swap_ok(shared, scaled_payload(shared, "scaled-baseline"))
    scaled = probe(shared)
    swap_ok(shared, path_body(shared.drafter, "initial-after-baseline"))
    return {"initial": initial, "scaled": scaled}


server = pytest.mark.server

# ---------------------------------------------------------------------------------------------------------------
# Version, auth, successful swaps
# ---------------------------------------------------------------------------------------------------------------


@server
def test_initial_version(shared_server: Shared) -> None:
    first = shared_server.initial_info
    assert first["version"] == "initial" and first["swaps"] == 0 and first["has_drafter"] is True
    assert first["path"] == str(shared_server.drafter)
    assert first["spec"]["block_size"] == 4 and first["spec"]["num_hidden_layers"] == 2
    now = info(shared_server)
    if now["swaps"] == 0:
        assert now == first


@server
def test_swap_needs_the_admin_key(shared_server: Shared) -> None:
    before = info(shared_server)
    body = scaled_payload(shared_server, "unauthorised")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_KEY}):
        r = swap(shared_server, body, headers=headers)
        assert r.status_code == 401, (headers, r.status_code, r.text[:300])
    assert info(shared_server) == before
    # the normal endpoints stay open (no --api-key)
    assert httpx.get(shared_server.url + DRAFTER_INFO_PATH, timeout=60).status_code == 200


@server
def test_swap_changes_proposals_not_outputs(shared_server: Shared, baselines) -> None:
    shared = shared_server
    initial, scaled = baselines["initial"], baselines["scaled"]
    mask_id = json.loads((shared.drafter / "config.json").read_text())["dflash_config"]["mask_token_id"]
    assert {t for p in initial["proposed"] for t in p} == {mask_id}, "a 0.02-init drafter proposes the mask token"
    assert {t for p in scaled["proposed"] for t in p} != {mask_id}
    assert scaled["proposed"] != initial["proposed"]
    assert scaled["output"] == initial["output"], "the target verifies: the drafter cannot change greedy output"
    assert scaled["versions"] == ["scaled-baseline"]

    out = swap_ok(shared, scaled_payload(shared, "scaled-1"))
    assert out["version"] == "scaled-1"
    after = probe(shared)
    assert after["versions"] == ["scaled-1"]
    assert after["trace"] == scaled["trace"], "the same weights propose the same tokens"
    for p in PROMPTS:
        resp = shared.srv.generate(p, NEW_TOKENS)
        assert resp["output_ids"] == shared.reference[p], p
        assert resp["meta_info"][VERSIONS_KEY] == ["scaled-1"]


@server
def test_swap_by_json_path(shared_server: Shared, baselines) -> None:
    shared = shared_server
    out = swap_ok(shared, path_body(shared.drafter))
    assert out["version"] == shared.drafter.name  # the directory name when no version is given
    back = probe(shared)
    assert back["trace"] == baselines["initial"]["trace"], "swapping the initial weights back restores them exactly"
    assert back["versions"] == [shared.drafter.name]
    out = swap_ok(shared, path_body(shared.scaled_drafter, "scaled-json"))
    assert out["version"] == "scaled-json"
    p = probe(shared)
    assert p["trace"] == baselines["scaled"]["trace"] and p["versions"] == ["scaled-json"]


@server
def test_swap_reaches_new_requests_on_cached_prefixes(shared_server: Shared, baselines) -> None:
    """A request after a swap whose prompt was in the radix cache proposes exactly like the new drafter.

    (The DFlash draft KV of cached tokens holds the context projections of the drafter that computed them, so an
    idle swap flushes the radix cache.)
    """
    shared = shared_server
    swap_ok(shared, path_body(shared.drafter, "initial-cached"))
    probe(shared)  # the probe prompt is now cached, with the initial drafter's draft KV
    swap_ok(shared, scaled_payload(shared, "scaled-cached"))
    cached = probe(shared, flush=False)
    assert cached["output"] == baselines["scaled"]["output"]
    assert cached["trace"] == baselines["scaled"]["trace"], (
        "after a swap, a cached prefix still carries the previous drafter's draft KV")


# ---------------------------------------------------------------------------------------------------------------
# Refused swaps change nothing
# ---------------------------------------------------------------------------------------------------------------


def _refused_cases(shared: Shared) -> Dict[str, tuple]:
    """name -> (body, words expected in the reason). Bodies are built from the INITIAL drafter's tensors while
    the scaled drafter serves, so a partial load would show in the proposals."""
    config, tensors = load_drafter(shared.drafter)
    target_cfg = json.loads((shared.target / "config.json").read_text())
    name2d = next(n for n, t in tensors.items() if t.dim() == 2)
    cases = {}
    cases["target directory"] = (path_body(shared.target), ["architectures"])
    cases["target config"] = (swap_payload(target_cfg, tensors, "t"), ["architectures"])
    t = dict(tensors)
    t[name2d] = torch.zeros(t[name2d].shape[0], t[name2d].shape[1] + 1)
    cases["wrong shape"] = (swap_payload(config, t, "s"), ["shape", name2d])
    t = dict(tensors)
    del t["norm.weight"]
    cases["missing tensor"] = (swap_payload(config, t, "m"), ["missing", "norm.weight"])
    t = {**tensors, "lm_head.weight": torch.zeros(4, 4)}
    cases["extra tensor"] = (swap_payload(config, t, "e"), ["unexpected", "lm_head.weight"])
    good = swap_payload(config, tensors, "trunc")
    cases["truncated payload"] = (good[: len(good) // 2], ["malformed"])
    tampered = {k: v.clone() for k, v in tensors.items()}
    tampered[name2d][0, 0] += 1.0
    cases["checksum mismatch"] = (encode_tensors(tampered, {"config": config, "version": "c",
                                                            "sha256_of_tensors": tensors_digest(tensors)}),
                                  ["checksum mismatch"])
    cfg8 = json.loads(json.dumps(config))
    cfg8["dflash_config"]["block_size"] = 8
    cases["different block_size"] = (swap_payload(cfg8, tensors, "b8"), ["block_size"])
    cfg_layers = json.loads(json.dumps(config))
    cfg_layers["num_hidden_layers"] = 3
    cfg_layers["layer_types"] = ["full_attention"] * 3
    cases["different layer count"] = (swap_payload(cfg_layers, tensors, "l3"), ["num_hidden_layers"])
    t = {k: v.clone() for k, v in tensors.items()}
    t[name2d][1, 1] = float("nan")
    cases["non-finite value"] = (swap_payload(config, t, "nan"), ["non-finite"])
    t = {**tensors, name2d: torch.zeros(tensors[name2d].shape, dtype=torch.int32)}
    cases["integer dtype"] = (swap_payload(config, t, "int"), ["dtype"])
    # measured 500s (issue 18) and an empty checksum that was taken as "no checksum": all 400 with the reason
    cases["checksum an int"] = (_with_checksum(config, tensors, 12345), ["sha256_of_tensors", "int"])
    cases["checksum an object"] = (_with_checksum(config, tensors, {"a": 1}), ["sha256_of_tensors", "dict"])
    cases["checksum empty"] = (_with_checksum(config, tensors, ""), ["sha256_of_tensors", "hex"])
    t = {**tensors, name2d: tensors[name2d].to(torch.float8_e4m3fn)}
    cases["float8 dtype"] = (swap_payload(config, t, "f8"), [name2d, "float8_e4m3fn"])
    cases["no config"] = (encode_tensors(tensors, {"version": "nocfg"}), ["architectures"])
    cases["config not an object"] = (encode_tensors(tensors, {"config": [1, 2], "version": "x"}), ["config"])
    cases["missing directory"] = (path_body(shared.drafter.parent / "does-not-exist"), ["cannot read"])
    cases["JSON without path"] = (json.dumps({"version": "v"}).encode(), ["path"])
    cases["JSON path not a string"] = (json.dumps({"path": 5}).encode(), ["path"])
    cases["bad JSON"] = (b"{not json", [])
    cases["empty body"] = (b"", ["empty body"])
    cases["garbage bytes"] = (b"\x00\x01garbage" * 10, ["malformed"])
    return cases


REFUSED = ["target directory", "target config", "wrong shape", "missing tensor", "extra tensor", "truncated payload",
           "checksum mismatch", "different block_size", "different layer count", "non-finite value",
           "integer dtype", "checksum an int", "checksum an object", "checksum empty", "float8 dtype", "no config",
           "config not an object", "missing directory", "JSON without path", "JSON path not a string", "bad JSON",
           "empty body", "garbage bytes"]


@pytest.fixture(scope="module")
def serving_scaled(shared_server: Shared, baselines) -> dict:
    """Swap to the scaled drafter (once for all refusal cases); its probe and drafter info."""
    swap_ok(shared_server, scaled_payload(shared_server, "scaled-refusals"))
    return {"probe": probe(shared_server), "info": info(shared_server),
            "cases": _refused_cases(shared_server)}


@server
@pytest.mark.parametrize("case", REFUSED)
def test_refused_swap_changes_nothing(shared_server: Shared, serving_scaled, case: str) -> None:
    body, words = serving_scaled["cases"][case]
    r = swap(shared_server, body)
    assert r.status_code in (400, 413, 422), (r.status_code, r.text[:500])
    msg = r.json()["error"]["message"]
    assert msg
    for w in words:
        assert w.lower() in msg.lower(), (w, msg)
    assert info(shared_server) == serving_scaled["info"], "a refused swap must not bump the version"
    after = probe(shared_server)
    assert after["trace"] == serving_scaled["probe"]["trace"], "a refused swap must not change any weight"
    assert after["versions"] == ["scaled-refusals"]


@server
def test_swap_payload_over_limit_is_413(shared_server: Shared, serving_scaled) -> None:
    r = swap(shared_server, b"\x00" * (MAX_PAYLOAD + 1))
    assert r.status_code == 413 and "exceeds the limit" in r.json()["error"]["message"]
    assert info(shared_server) == serving_scaled["info"]


# ---------------------------------------------------------------------------------------------------------------
# Rollback (unit): a load that fails half-way restores every parameter
# ---------------------------------------------------------------------------------------------------------------


class _FakeDraftModel(torch.nn.Module):
    def __init__(self, fail_after=None):
        super().__init__()
        self.a = torch.nn.Linear(3, 3, bias=False)
        self.b = torch.nn.Linear(3, 2, bias=False)
        self.norm = torch.nn.Parameter(torch.ones(3))
        self.fail_after = fail_after
        self.loaded: List[str] = []

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, t in weights:
            params[name].copy_(t)
            self.loaded.append(name)
            if self.fail_after is not None and len(self.loaded) >= self.fail_after:
                raise RuntimeError("simulated failure while loading")


class _FakeWorker:
    def __init__(self, model):
        self.draft_model = model
        self._fused_kv_helper = object()
        self.helper_inits = 0

    def _init_fused_kv_helper(self):
        self.helper_inits += 1


def _new_tensors(model):
    return {n: torch.full_like(p, 7.0) for n, p in model.named_parameters()}


def test_apply_swap_rolls_back_on_failure() -> None:
    from sglang_specopd.server.drafter.swap import apply_swap

    torch.manual_seed(0)
    model = _FakeDraftModel(fail_after=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    worker = _FakeWorker(model)
    with pytest.raises(RuntimeError, match="simulated failure"):
        apply_swap(worker, _new_tensors(model))
    assert len(model.loaded) == 2, "the failure came after some parameters had been overwritten"
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    assert worker.helper_inits == 1, "the fused context-KV helper is rebuilt from the restored weights"


def test_apply_swap_success_and_no_helper() -> None:
    from sglang_specopd.server.drafter.swap import apply_swap

    model = _FakeDraftModel()
    worker = _FakeWorker(model)
    apply_swap(worker, _new_tensors(model))
    assert all(torch.equal(p, torch.full_like(p, 7.0)) for p in model.parameters())
    assert worker.helper_inits == 1
    worker = _FakeWorker(_FakeDraftModel(fail_after=1))
    worker._fused_kv_helper = None
    with pytest.raises(RuntimeError):
        apply_swap(worker, _new_tensors(worker.draft_model))
    assert worker.helper_inits == 0
    assert all(not torch.equal(p, torch.full_like(p, 7.0)) for p in worker.draft_model.parameters())


class _FakeDSparkModel(_FakeDraftModel):
    """A DSpark-like draft model: the target's embedding and LM head lent by the worker, SGLang's two caches of
    pre-stacked context-KV weights (``DSparkDraftMixin``) built."""

    def __init__(self, fail_after=None):
        super().__init__(fail_after)
        self.embed_tokens = torch.nn.Embedding(5, 3)  # attach_shared_modules: the target's, not the drafter's
        self.lm_head = torch.nn.Linear(3, 5, bias=False)
        self._stacked_ctx_kv_cache = {"weight": self.a.weight.detach().clone()}
        self._fused_kv_write_cache = (1234, object())


def test_apply_swap_drops_dspark_weight_caches_and_skips_lent_modules() -> None:
    from sglang_specopd.server.drafter.swap import _own_parameters, apply_swap

    model = _FakeDSparkModel()
    own = _own_parameters(model, ["a.weight", "b.weight", "norm"])
    assert sorted(own) == ["a.weight", "b.weight", "norm"], "the lent embedding / LM head are not backed up"
    assert "embed_tokens.weight" in _own_parameters(model, ["embed_tokens.weight"]), "unless a tensor names them"
    worker = _FakeWorker(model)
    worker._fused_kv_helper = None  # the DSPARK worker has no DFLASH helper
    tensors = {n: torch.full_like(p, 7.0) for n, p in model.named_parameters() if n in own}
    apply_swap(worker, tensors)
    assert model._stacked_ctx_kv_cache is False, "reset to SGLang's not-built marker: rebuilt from the new weights"
    assert model._fused_kv_write_cache is None
    assert torch.equal(model.a.weight, torch.full_like(model.a.weight, 7.0)) and worker.helper_inits == 0

    model = _FakeDSparkModel(fail_after=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(RuntimeError, match="simulated failure"):
        apply_swap(_FakeWorker(model), tensors)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert model._stacked_ctx_kv_cache is False and model._fused_kv_write_cache is None, "also after a rollback"


# ---------------------------------------------------------------------------------------------------------------
# Swaps under load
# ---------------------------------------------------------------------------------------------------------------


@server
def test_swaps_under_concurrent_greedy_requests(shared_server: Shared, baselines) -> None:
    """4 threads keep issuing greedy requests while 3 swaps happen: every reply is the pre-swap greedy output."""
    shared = shared_server
    bodies = [("scaled-c1", scaled_payload(shared, "scaled-c1")),
              ("initial-c2", path_body(shared.drafter, "initial-c2")),
              ("scaled-c3", scaled_payload(shared, "scaled-c3"))]
    known = {info(shared)["version"]} | {v for v, _ in bodies}
    stop = threading.Event()
    epoch = [0]  # bumped after each swap's reply
    fresh = [-1] * 4  # per worker: the latest epoch in which one of its requests both started and finished
    results: List[tuple] = []
    errors: List[BaseException] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        try:
            with httpx.Client(timeout=120) as client:
                i = k
                while not stop.is_set():
                    prompt = PROMPTS[i % len(PROMPTS)]
                    i += 1
                    with lock:
                        started = epoch[0]
                    r = client.post(shared.url + "/generate", json={"text": prompt, "sampling_params": {
                        "temperature": 0.0, "max_new_tokens": CONCURRENT_TOKENS, "ignore_eos": True}})
                    with lock:
                        results.append((prompt, r.status_code, r.text))
                        fresh[k] = max(fresh[k], started)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()

    def wait_all_fresh(timeout: float = 90.0) -> None:
        """Until every worker has finished a request that started after the latest swap."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not stop.is_set():
            with lock:
                if all(f >= epoch[0] for f in fresh):
                    return
            time.sleep(0.05)
        raise AssertionError(f"workers stalled: {fresh} at epoch {epoch[0]}; errors {errors}")

    try:
        wait_all_fresh()
        for version, body in bodies:
            r = swap(shared, body)
            assert r.status_code == 200, r.text[:300]
            assert r.json()["version"] == version
            with lock:
                epoch[0] += 1
            wait_all_fresh()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors
    assert len(results) >= 4 * 4
    seen = set()
    for prompt, status, text in results:
        assert status == 200, text[:300]
        resp = json.loads(text)
        assert resp["output_ids"] == shared.reference[prompt][:CONCURRENT_TOKENS], prompt
        meta = resp["meta_info"]
        assert meta["completion_tokens"] == CONCURRENT_TOKENS and meta["finish_reason"]["type"] == "length"
        versions = meta[VERSIONS_KEY]
        assert isinstance(versions, list) and versions and set(versions) <= known, versions
        seen |= set(versions)
    assert {"scaled-c1", "initial-c2", "scaled-c3"} <= seen, seen
    assert info(shared)["version"] == "scaled-c3"


# ---------------------------------------------------------------------------------------------------------------
# Swap request validation (unit): every bad body is a ValueError (HTTP 400) with the reason, never another error
# ---------------------------------------------------------------------------------------------------------------


def _unit_refusal(tiny_drafter: Path, body: bytes) -> str:
    """The reason the scheduler op would refuse ``body`` with (a ValueError: HTTP 400); fails if it passes."""
    from sglang_specopd.server.drafter.swap import check_swap_request
    from sglang_specopd.wire.drafters.archs import load_drafter_spec

    with pytest.raises(ValueError) as info:
        check_swap_request(load_drafter_spec(tiny_drafter), body)
    assert type(info.value) is ValueError or isinstance(info.value, json.JSONDecodeError), type(info.value)
    return str(info.value)


def _with_checksum(config: dict, tensors: dict, checksum) -> bytes:
    return encode_tensors(tensors, {"config": config, "version": "v", "sha256_of_tensors": checksum})


@pytest.mark.parametrize("checksum", [12345, {"sha256": "ab"}, "", None, ["ab"], "xyz", "ab" * 31])
def test_swap_checksum_must_be_a_hex_sha256(tiny_drafter: Path, checksum) -> None:
    """sha256_of_tensors, when present, is a 64-digit hex string: an int or an object was a TypeError (HTTP 500),
    an empty string was taken as "no checksum" and the swap went through."""
    config, tensors = load_drafter(tiny_drafter)
    msg = _unit_refusal(tiny_drafter, _with_checksum(config, tensors, checksum))
    assert "sha256_of_tensors" in msg and "hex" in msg, msg


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.float64, torch.int32, torch.bool,
                                   torch.complex64])
def test_swap_unsupported_dtype_is_refused_by_name(tiny_drafter: Path, dtype) -> None:
    """Only float32 / bfloat16 / float16 tensors: float8 was an ``isfinite`` NotImplementedError (HTTP 500). The
    check comes before the checksum (computed over the raw bytes) and before any value check."""
    config, tensors = load_drafter(tiny_drafter)
    name = sorted(tensors)[0]
    bad = {**tensors, name: tensors[name].to(dtype)}
    for body in (swap_payload(config, bad, "v"), encode_tensors(bad, {"config": config, "version": "v"})):
        msg = _unit_refusal(tiny_drafter, body)
        assert name in msg and str(dtype).replace("torch.", "") in msg, msg


@pytest.mark.parametrize("version", [5, "", ["a"], {"v": 1}])
def test_swap_version_must_be_a_non_empty_string(tiny_drafter: Path, version) -> None:
    config, tensors = load_drafter(tiny_drafter)
    body = encode_tensors(tensors, {"config": config, "version": version, "sha256_of_tensors": tensors_digest(tensors)})
    assert "version" in _unit_refusal(tiny_drafter, body)
    assert "version" in _unit_refusal(tiny_drafter, json.dumps({"path": str(tiny_drafter), "version": version}).encode())


def test_swap_json_request_refuses_unknown_keys_and_bad_json(tiny_drafter: Path) -> None:
    assert "unknown" in _unit_refusal(tiny_drafter, json.dumps({"path": str(tiny_drafter), "junk": 1}).encode())
    assert "JSON" in _unit_refusal(tiny_drafter, b"{not json")
    assert "JSON" in _unit_refusal(tiny_drafter, b'{"path": "\xff"}')


def test_swap_accepts_the_supported_dtypes_with_their_checksum(tiny_drafter: Path) -> None:
    from sglang_specopd.server.drafter.swap import check_swap_request
    from sglang_specopd.wire.drafters.archs import load_drafter_spec

    config, tensors = load_drafter(tiny_drafter)
    spec = load_drafter_spec(tiny_drafter)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        cast = {k: v.to(dtype) for k, v in tensors.items()}
        body = swap_payload(config, cast, f"v-{dtype}")
        cfg, got, version = check_swap_request(spec, body)
        assert version == f"v-{dtype}" and cfg == config and set(got) == set(tensors)
        assert all(torch.equal(got[k], cast[k]) for k in cast)
        upper = encode_tensors(cast, {"config": config, "sha256_of_tensors": tensors_digest(cast).upper()})
        assert check_swap_request(spec, upper)[2] == hashlib.sha256(upper).hexdigest()[:12]
    assert check_swap_request(spec, encode_tensors(tensors, {"config": config}))[1].keys() == tensors.keys()
    assert check_swap_request(spec, path_body(tiny_drafter))[2] == tiny_drafter.name
