"""Property-based fuzz of every HTTP route the plugin serves or reads client data from, on one tiny SPECOPD server.

Routes (strategies: ``benchmarks/fuzz_routes/strategies.py``, shared with ``tests/test_fuzz_routes.py``):
``POST /specopd/score_trees`` (JSON and binary bodies: random structures, wrong types, huge/negative ints, bad safetensors, random headers),
``POST /specopd/drafter/swap`` (random safetensors bodies with random names/dtypes/shapes/headers, mutated valid
payloads, JSON path bodies; with and without the admin key), ``GET /specopd/prefix_cache`` and
``POST /specopd/prefix_cache/clear`` (with and without the key), and generation (``/generate`` and
``/v1/completions``) with random ``custom_params`` / ``specopd_trace`` values, and crafted hostile requests to every
route the plugin adds (``benchmarks/fuzz_routes/crafted.py``: deep nesting, huge and negative integers, NaN / Infinity,
duplicate keys, truncated bodies, wrong content types, slow and stalled bodies, ``Connection: close`` uploads
answered early). Property: every request gets an HTTP answer (no connection reset, no timeout) that is < 500 and
well-formed (JSON with a reason; a score_trees 200 is decodable safetensors; a stalled body 408); afterwards
``/health`` is 200 and a fixed greedy probe gives the same tokens as before. The server is the tests' tiny admin
server (1 MB payload limit, a stalled body answered after 3 s)::

    python benchmarks/fuzz_routes/run.py --examples 10000

Writes ``benchmarks/results/fuzz_routes_cpu.json``: ``examples`` by kind (each crafted kind, e.g.
``deep_nesting``, and the generic examples under their route's name), ``examples_by_route``, ``statuses`` per
route and ``statuses_by_kind``, ``status_5xx``, ``connection_resets``, ``timeouts``, violations, health, probe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import httpx
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fuzz_routes.admin_routes import ADMIN_STRATEGIES  # noqa: E402  (rollout, policy, traffic)
from fuzz_routes.crafted import crafted  # noqa: E402  (the crafted hostile kinds)
from fuzz_routes.strategies import STRATEGIES as ROUTE_STRATEGIES  # noqa: E402  (one source of the strategies)
from fuzz_routes.strategies import (  # noqa: E402
    ADMIN_KEY,
    WEIGHTS,
    Case,
    Target,
)
from sglang_specopd.wire.protocol import BINARY_CONTENT_TYPE, decode_tensors  # noqa: E402

STRATEGIES = {**ROUTE_STRATEGIES, **ADMIN_STRATEGIES, "crafted": crafted}
EXAMPLES_ENV = "SPECOPD_FUZZ_EXAMPLES"
DEFAULT_EXAMPLES = 150
REQUEST_TIMEOUT_S = 60.0  # no answer within this: a timeout (counted, and a violation)
# what the fuzz server runs with (the tests' tiny admin server: tests/conftest.py)
SERVER_ENV = {"SPECOPD_MAX_PAYLOAD_BYTES": "1000000", "SPECOPD_BODY_IDLE_S": "3"}
PROBE_PROMPT = "The fuzz probe: greedy tokens before and after."
PROBE_TOKENS = 12


def examples_per_route(total: int) -> Dict[str, int]:
    """Split ``total`` examples over the routes by :data:`WEIGHTS` (each route at least 1)."""
    return {route: max(1, round(total * w)) for route, w in WEIGHTS.items()}



# ---------------------------------------------------------------------------------------------------------------
# Property and runner
# ---------------------------------------------------------------------------------------------------------------


def check_reply(case: Case, status: int, content: bytes, content_type: str) -> List[str]:
    """Problems with one reply ([] = the property holds): < 500, JSON error bodies with a message, decodable
    score_trees replies, 401 for every unauthorised admin call."""
    problems = []
    if status >= 500:
        problems.append(f"{status} >= 500")
    if case.meta.get("unauthorised") and status != 401:
        problems.append(f"unauthorised admin call answered {status}")
    if case.meta.get("expect") is not None and not case.meta.get("unauthorised") and status != case.meta["expect"]:
        problems.append(f"expected {case.meta['expect']}, answered {status}")
    if status == 200 and content_type.startswith(BINARY_CONTENT_TYPE):
        try:
            decode_tensors(content)
        except ValueError as exc:
            problems.append(f"undecodable binary reply: {exc}")
        return problems
    try:
        body = json.loads(content)
    except ValueError:
        return problems + [f"reply is not JSON: {content[:120]!r}"]
    if status != 200:
        if not error_reason(body):
            problems.append(f"{status} without a reason: {content[:120]!r}")
    elif case.path == "/generate" and case.meta.get("trace") is True:
        if not isinstance(body.get("meta_info", {}).get("specopd_trace"), list):
            problems.append("a traced /generate reply has no specopd_trace list")
    return problems


def error_reason(body) -> Optional[str]:
    """The reason in an error reply: ``{"error": {"message"}}`` (the plugin, /generate), ``{"error": str}`` (SGLang's
    auth), ``{"object": "error", "message"}`` (the OpenAI API) or ``{"detail"}`` (FastAPI); None when absent."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    reason = err.get("message") if isinstance(err, dict) else err
    return str(reason or body.get("message") or body.get("detail") or "") or None


# What a request without an HTTP answer counts as (its status key in the tallies)
RESET, TIMEOUT, TRANSPORT = "reset", "timeout", "transport"


@dataclass
class Tally:
    """Per route and per kind: examples sent and status counts (an HTTP status, or ``reset`` / ``timeout`` /
    ``transport`` for a request without an answer); every property violation with its request."""

    statuses: Dict[str, Counter] = field(default_factory=dict)
    kinds: Dict[str, Counter] = field(default_factory=dict)
    violations: List[dict] = field(default_factory=list)

    def add(self, route: str, status, kind: Optional[str] = None) -> None:
        self.statuses.setdefault(route, Counter())[str(status)] += 1
        self.kinds.setdefault(kind or route, Counter())[str(status)] += 1

    def summary(self) -> dict:
        def count(key: str) -> int:
            return sum(c[key] for c in self.statuses.values())

        return {"examples": {k: sum(c.values()) for k, c in self.kinds.items()},
                "examples_by_route": {r: sum(c.values()) for r, c in self.statuses.items()},
                "statuses": {r: dict(sorted(c.items())) for r, c in self.statuses.items()},
                "statuses_by_kind": {k: dict(sorted(c.items())) for k, c in self.kinds.items()},
                "status_5xx": sum(n for c in self.statuses.values() for s, n in c.items() if s.isdigit()
                                  and int(s) >= 500),
                "connection_resets": count(RESET), "timeouts": count(TIMEOUT), "transport_errors": count(TRANSPORT),
                "violations": len(self.violations), "first_violations": self.violations[:10]}


def no_answer_kind(exc: Exception) -> str:
    """``reset`` (the server reset or closed the connection without an answer), ``timeout`` or ``transport``."""
    if isinstance(exc, httpx.TimeoutException):
        return TIMEOUT
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)) or "reset" in text.lower():
        return RESET
    return TRANSPORT


def _slow(body: bytes, pieces):
    """The body as an iterator of ``(bytes, pause before them)`` pieces (``Case.meta["slow"]``)."""
    at = 0
    for size, pause in pieces:
        if pause:
            time.sleep(pause)
        yield body[at:at + size]
        at += size
    if at < len(body):
        yield body[at:]


def send(client: httpx.Client, url: str, case: Case) -> Tuple[object, List[str]]:
    """Send ``case``; (status or no-answer kind, problems). A request without an HTTP answer is a problem."""
    headers, content = dict(case.headers), case.body or None
    if case.meta.get("slow"):
        headers["Content-Length"] = str(len(case.body))
        content = _slow(case.body, case.meta["slow"])
    try:
        r = client.request(case.method, url + case.path, headers=headers, content=content)
    except httpx.HTTPError as exc:
        kind = no_answer_kind(exc)
        return kind, [f"no answer ({kind}): {type(exc).__name__}: {exc}"]
    return r.status_code, check_reply(case, r.status_code, r.content, r.headers.get("content-type", ""))


def fuzz_route(target: Target, route: str, examples: int, tally: Tally, *, strict: bool,
               derandomize: bool = True) -> None:
    """Run ``examples`` hypothesis examples of ``route`` against the server; record statuses in ``tally``.
    ``strict``: a violated property fails the example (hypothesis shrinks and raises); else it is recorded."""
    client = httpx.Client(timeout=REQUEST_TIMEOUT_S)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(STRATEGIES[route](target))
    def one(case: Case) -> None:
        status, problems = send(client, target.url, case)
        tally.add(route, status, case.meta.get("kind"))
        if problems:
            tally.violations.append({"route": route, "status": status, "problems": problems,
                                     "request": f"{case.method} {case.path} {case.headers} {case.body[:200]!r}"})
            assert not (strict and problems), (problems, case)

    try:
        one()
    finally:
        client.close()


def crafted_split(total: int) -> Dict[str, int]:
    """``total`` crafted examples split over the kinds by ``fuzz_routes.crafted.KIND_WEIGHTS`` (each kind at least 1)."""
    from fuzz_routes.crafted import KIND_WEIGHTS

    norm = sum(KIND_WEIGHTS.values())
    return {kind: max(1, round(total * w / norm)) for kind, w in KIND_WEIGHTS.items()}


def fuzz_kinds(target: Target, per_kind, tally: Tally, *, strict: bool) -> None:
    """Crafted examples kind by kind (``benchmarks/fuzz_routes/crafted.py``): ``per_kind`` is a count for every kind or
    ``{kind: count}``; hypothesis stops a kind early when it has no more distinct examples."""
    from fuzz_routes.crafted import KINDS

    counts = per_kind if isinstance(per_kind, dict) else {kind: per_kind for kind in KINDS}
    client = httpx.Client(timeout=REQUEST_TIMEOUT_S)
    try:
        for kind, n in counts.items():
            @settings(max_examples=n, deadline=None, database=None, derandomize=True, print_blob=True,
                      suppress_health_check=list(HealthCheck))
            @given(KINDS[kind](target))
            def one(case: Case) -> None:
                status, problems = send(client, target.url, case)
                tally.add("crafted", status, kind)
                if problems:
                    request = f"{case.method} {case.path} {case.headers} {case.body[:200]!r}"
                    tally.violations.append({"route": "crafted", "kind": kind, "status": status, "problems": problems,
                                             "request": request})
                    assert not (strict and problems), (problems, case)

            one()
    finally:
        client.close()


def greedy_probe(url: str) -> List[int]:
    """The greedy output ids of :data:`PROBE_PROMPT` (the fuzz must not change them)."""
    r = httpx.post(url + "/generate", json={"text": PROBE_PROMPT, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": PROBE_TOKENS, "ignore_eos": True}}, timeout=300)
    r.raise_for_status()
    return r.json()["output_ids"]


def start_up_policy(url: str) -> Optional[str]:
    """The server's speculative policy (``fixed`` / ``goodput``) before the fuzz; None without the policy route."""
    from sglang_specopd.wire.policy import POLICY_PATH

    r = httpx.get(url + POLICY_PATH, timeout=60)
    return r.json().get("policy") if r.status_code == 200 else None


def clean_up(url: str, route: str, policy: Optional[str]) -> None:
    """After a route's examples, undo what valid ones changed so that later routes (and the tests sharing the
    server) see it as it was: a staged rollout transaction is aborted, the start-up policy set again."""
    from sglang_specopd.wire.policy import POLICY_PATH
    from sglang_specopd.wire.protocol import DRAFTER_ADMIN_INFO_PATH
    from sglang_specopd.wire.rollout import ABORT_DRAFTER_PATH

    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    if route == "rollout":
        staged = httpx.get(url + DRAFTER_ADMIN_INFO_PATH, headers=headers, timeout=60).json().get("staged")
        if staged:
            httpx.post(url + ABORT_DRAFTER_PATH, json={"txn": staged["txn"]}, headers=headers,
                       timeout=60).raise_for_status()
    elif route == "policy" and policy is not None:
        httpx.post(url + POLICY_PATH, json={"policy": policy}, headers=headers, timeout=60).raise_for_status()


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=60).status_code == 200
    except httpx.HTTPError:
        return False


def target_for(url: str, target_dir: Path, drafter_dir: Path) -> Target:
    """The :class:`Target` of a running server serving ``drafter_dir`` on ``target_dir``."""
    from safetensors.torch import load_file

    models = httpx.get(url + "/v1/models", timeout=60).json()["data"]
    return Target(url=url, vocab_size=int(json.loads((target_dir / "config.json").read_text())["vocab_size"]),
                  drafter_config=json.loads((drafter_dir / "config.json").read_text()),
                  drafter_tensors=load_file(str(drafter_dir / "model.safetensors")), drafter_dir=str(drafter_dir),
                  target_dir=str(target_dir), model_name=models[0]["id"])


def run_all(target: Target, total: int, *, strict: bool, on_route: Optional[Callable[[dict], None]] = None) -> dict:
    """Probe, fuzz every route (``total`` examples split by :data:`WEIGHTS`), probe again: the result dict.
    ``on_route``: called with the partial summary (``routes_done``) after each route (a long run's progress)."""
    before = greedy_probe(target.url)
    start_policy = start_up_policy(target.url)
    tally, t0 = Tally(), time.monotonic()
    for route, n in examples_per_route(total).items():
        try:
            if route == "crafted":  # kind by kind, so that every kind gets its share
                fuzz_kinds(target, crafted_split(n), tally, strict=strict)
            else:
                fuzz_route(target, route, n, tally, strict=strict)
        finally:
            clean_up(target.url, route, start_policy)
        if on_route is not None:
            on_route({**tally.summary(), "routes_done": sorted(tally.statuses), "complete": False,
                      "wall_s": round(time.monotonic() - t0, 1)})
    after_ok = healthy(target.url)
    after = greedy_probe(target.url) if after_ok else None
    return {**tally.summary(), "examples_total": sum(sum(c.values()) for c in tally.statuses.values()),
            "wall_s": round(time.monotonic() - t0, 1), "healthy_after": after_ok, "probe_tokens": before,
            "probe_identical": after == before, "complete": True}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000, help="examples over all routes")
    ap.add_argument("--out", default="benchmarks/results/fuzz_routes_cpu.json")
    args = ap.parse_args(argv)
    tests = Path(__file__).resolve().parents[2] / "tests"
    sys.path.insert(0, str(tests))
    import tempfile

    from _tiny_target import make_tiny_target
    from conftest import running_server, tiny_launch_spec

    from sglang_specopd.app.launch.process import free_port
    from sglang_specopd.app.results import write_result
    from sglang_specopd.wire.drafters.init import init_drafter

    os.environ.update(SERVER_ENV)  # read by the server's HTTP process at launch
    with tempfile.TemporaryDirectory() as tmp:
        target_dir = make_tiny_target(Path(tmp) / "llama", seed=0)
        drafter_dir = Path(tmp) / "drafter"
        init_drafter(target_dir, drafter_dir, block_size=4, num_layers=2, seed=0)
        spec = fuzz_launch_spec(tiny_launch_spec(target_dir, free_port(), drafter_dir))
        command = " ".join(["python", "benchmarks/fuzz_routes/run.py", *(argv or sys.argv[1:])])

        def save(partial: dict) -> None:
            write_result(args.out, {**partial, "examples_requested": args.examples}, command=command)

        with running_server(spec, Path(tmp), "fuzz-routes") as srv:
            result = run_all(target_for(srv.url, target_dir, drafter_dir), args.examples, strict=False, on_route=save)
    save(result)
    result["examples_requested"] = args.examples
    print(json.dumps({k: v for k, v in result.items() if k != "first_violations"}, indent=1))
    clean = result["status_5xx"] == 0 and result["connection_resets"] == 0 and result["timeouts"] == 0
    return 0 if clean and result["probe_identical"] and not result["violations"] else 1


def fuzz_launch_spec(spec):
    """``spec`` with the admin key and a score_trees prefix cache (so clear/stats have something to act on)."""
    import dataclasses

    return dataclasses.replace(spec, admin_api_key=ADMIN_KEY, prefix_cache_mb=16)


if __name__ == "__main__":
    raise SystemExit(main())
