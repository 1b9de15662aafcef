"""A bounded-rate sender of malformed requests: score_trees, drafter swap and generate (self-contained).

Every case is something a server must refuse with a 4xx and a parseable reason, never a 5xx, a hang or a crash:
random JSON junk, non-UTF-8 bytes, truncated binary (safetensors) bodies, wrong keys and wrong types, token ids
outside the vocabulary (score_trees only: SGLang's own /generate does not check input ids), deeply nested JSON,
NaN and duplicate keys, swaps of garbage or of a missing directory (with the admin key, so the plugin's validation
runs) and a swap without the key. None of them can change the serving drafter: they are invalid by construction.
One kind is valid on purpose: a small score_trees request (``score_trees_small_valid``), whose queue wait the
server reports (``X-SpecOPD-Queue-Wait-S``, kept in :attr:`Fuzzer.score_waits`): a small request sent while the
trainer's are scored must get a timely answer or a 429, never a silent wait.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from sglang_specopd.wire.protocol import BINARY_CONTENT_TYPE, QUEUE_WAIT_HEADER, SCORE_TREES_PATH, SWAP_DRAFTER_PATH

from .proxy import queue_wait_of
from .stats import status_key
from .worker import Background

JSON_TYPE = "application/json"
PLUGIN_PATHS = (SCORE_TREES_PATH, SWAP_DRAFTER_PATH)


@dataclass(frozen=True)
class FuzzCase:
    """One malformed request: ``kind`` (a label), ``path``, ``body`` (bytes), ``content_type``, ``admin``."""

    kind: str
    path: str
    body: bytes
    content_type: str = JSON_TYPE
    admin: bool = False


def _junk(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value (nested at most 3 deep)."""
    pick = rng.randrange(7 if depth < 3 else 5)
    if pick == 0:
        return rng.randint(-2**40, 2**40)
    if pick == 1:
        return rng.random() * 10**rng.randint(-3, 9)
    if pick == 2:
        return "".join(rng.choice("abc{}[]\"\\ \u00e9\u4e2d") for _ in range(rng.randint(0, 12)))
    if pick == 3:
        return rng.choice([None, True, False])
    if pick == 4:
        return []
    if pick == 5:
        return [_junk(rng, depth + 1) for _ in range(rng.randint(1, 4))]
    keys = ["references", "block_size", "input_ids", "trees", "anchor", "branches", "path", "text",
            "sampling_params", "max_new_tokens", "returns", "x"]
    return {rng.choice(keys): _junk(rng, depth + 1) for _ in range(rng.randint(1, 4))}


def _truncated_score_trees(rng: random.Random) -> bytes:
    """A valid binary score_trees request cut short at a random byte."""
    from sglang_specopd.wire.protocol import ScoreTreesRequest, request_to_binary

    req = ScoreTreesRequest.model_validate({"references": [{"input_ids": [1, 2, 3, 4, 5],
                                                            "trees": [{"anchor": 2, "branches": [[6, 7]]}]}],
                                            "block_size": 4})
    data = request_to_binary(req)
    return data[:rng.randint(1, len(data) - 1)]


def _truncated_swap(rng: random.Random) -> bytes:
    """A swap body (a one-tensor 'drafter' with a nonsense config) cut short at a random byte."""
    import torch

    from sglang_specopd.wire.protocol import swap_payload

    data = swap_payload({"junk": True}, {"w": torch.zeros(4)}, "fuzz")
    return data[:rng.randint(1, len(data) - 1)]


def _valid_shape(rng: random.Random) -> Dict[str, Any]:
    return {"references": [{"input_ids": [1, 2, 3, 4], "trees": [{"anchor": 1, "branches": [[5, 6]]}]}],
            "block_size": 4}


def make_case(rng: random.Random) -> FuzzCase:
    """Draw one malformed request (every kind about equally often)."""
    j = lambda obj: json.dumps(obj).encode()  # noqa: E731
    kinds: List[Tuple[str, Callable[[], FuzzCase]]] = [
        ("score_trees_junk", lambda: FuzzCase("score_trees_junk", SCORE_TREES_PATH, j(_junk(rng)))),
        ("score_trees_not_utf8", lambda: FuzzCase("score_trees_not_utf8", SCORE_TREES_PATH,
                                                  bytes(rng.randrange(128, 256) for _ in range(32)))),
        ("score_trees_truncated_binary", lambda: FuzzCase("score_trees_truncated_binary", SCORE_TREES_PATH,
                                                          _truncated_score_trees(rng), BINARY_CONTENT_TYPE)),
        ("score_trees_wrong_key", lambda: FuzzCase("score_trees_wrong_key", SCORE_TREES_PATH, j(
            {**_valid_shape(rng), rng.choice(["referencez", "blocksize", "top-k"]): 1}))),
        ("score_trees_bad_values", lambda: FuzzCase("score_trees_bad_values", SCORE_TREES_PATH, j(rng.choice([
            {**_valid_shape(rng), "block_size": rng.choice([0, 1, 65, -3, "8"])},
            {"references": [{"input_ids": [1, 2, 10**9], "trees": []}], "block_size": 4},
            {"references": [{"input_ids": [1, 2, 3], "trees": [{"anchor": 7, "branches": [[5]]}]}], "block_size": 4},
            {"references": [{"input_ids": [1, 2, 3], "trees": [{"anchor": 1, "tokens": [5, 6], "parents": [1, 0]}]}],
             "block_size": 4},
            {**_valid_shape(rng), "feature_layer_ids": [10**6]},
            {"references": [], "block_size": 4}])))),
        ("swap_junk", lambda: FuzzCase("swap_junk", SWAP_DRAFTER_PATH,
                                       bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))),
                                       BINARY_CONTENT_TYPE, admin=True)),
        ("swap_truncated", lambda: FuzzCase("swap_truncated", SWAP_DRAFTER_PATH, _truncated_swap(rng),
                                            BINARY_CONTENT_TYPE, admin=True)),
        ("swap_bad_json", lambda: FuzzCase("swap_bad_json", SWAP_DRAFTER_PATH, j(rng.choice([
            {"path": "/nonexistent/specopd-fuzz-drafter"}, {"path": 5}, {"dir": "/tmp"}, _junk(rng)])),
            admin=True)),
        ("swap_no_admin_key", lambda: FuzzCase("swap_no_admin_key", SWAP_DRAFTER_PATH, j({"path": "/tmp"}))),
        ("generate_junk", lambda: FuzzCase("generate_junk", "/generate", j(rng.choice([
            {"input_ids": "abc", "sampling_params": {"max_new_tokens": 4}},
            {"text": "hi", "sampling_params": {"max_new_tokens": -5}},
            {"text": "hi", "sampling_params": {"temperature": "hot", "max_new_tokens": 4}},
            {"text": "hi", "sampling_params": {"top_p": 7.0, "max_new_tokens": 4}},
            {"sampling_params": {"max_new_tokens": 4}}])))),
        ("generate_not_json", lambda: FuzzCase("generate_not_json", "/generate", b"{\"text\": \"hi\", ")),
        ("score_trees_deep_nesting", lambda: FuzzCase("score_trees_deep_nesting", SCORE_TREES_PATH,
                                                      rng.choice([b"[", b'{"a": ']) * rng.randint(1000, 20000))),
        ("score_trees_nan_or_duplicate", lambda: FuzzCase("score_trees_nan_or_duplicate", SCORE_TREES_PATH,
                                                          j(_valid_shape(rng))[:-1] + rng.choice(
                                                              [b', "top_k": NaN}', b', "block_size": 8}']))),
        ("swap_deep_nesting", lambda: FuzzCase("swap_deep_nesting", SWAP_DRAFTER_PATH,
                                               b'{"path": ' + b'{"a": ' * rng.randint(1000, 20000), admin=True)),
        ("score_trees_small_valid", lambda: FuzzCase("score_trees_small_valid", SCORE_TREES_PATH,
                                                     j(_valid_shape(rng)))),
    ]
    return rng.choice(kinds)[1]()


def response_malformed(path: str, status: int, content_type: str, body: bytes) -> bool:
    """True when a reply to a fuzz request does not parse or lacks the required keys.

    Every reply must be a JSON object. The plugin's routes answer errors as ``{"error": {"message": ...}}``
    (SGLang's auth middleware: ``{"error": "Unauthorized"}``); SGLang's own routes need one of ``error``,
    ``detail``, ``message`` (errors) or ``text`` / ``output_ids`` (a 200 from /generate).
    """
    if status == 200 and content_type.startswith(BINARY_CONTENT_TYPE):
        return False  # a scored reply (score_trees_small_valid); an error is counted by its status
    try:
        obj = json.loads(body)
    except ValueError:
        return True
    if not isinstance(obj, dict):
        return True
    if status < 400:
        return not any(k in obj for k in ("text", "output_ids", "version", "meta_info"))
    if path in PLUGIN_PATHS:
        err = obj.get("error")
        return not (isinstance(err, str) or (isinstance(err, Mapping) and isinstance(err.get("message"), str)))
    return not any(k in obj for k in ("error", "detail", "message"))


class Fuzzer(Background):
    """Sends :func:`make_case` requests to ``url`` at ``rate`` per second (at most one in flight) on a thread.

    ``record(error_key_or_None, malformed)`` is called per request (a 2xx counts as no error); ``examples`` keeps
    the first few (kind, status) pairs per kind for the result. Stop with :meth:`stop`.
    """

    def __init__(self, url: str, admin_key: str, rate: float, record: Callable[[Optional[str], bool], None],
                 seed: int = 0, timeout_s: float = 60.0, clock: Optional[Callable[[], float]] = None):
        if rate <= 0:
            raise ValueError(f"fuzz rate must be > 0 requests/s, got {rate}")
        self.url, self.admin_key, self.rate, self.record = url.rstrip("/"), admin_key, rate, record
        self.rng, self.timeout_s = random.Random(seed), timeout_s
        self.statuses: Dict[str, Dict[str, int]] = {}
        self.clock: Callable[[], float] = clock or time.perf_counter
        self.score_waits: List[Tuple[float, float, int]] = []  # (clock time, queue wait s, status) of score_trees
        super().__init__("soak-fuzzer", join_s=timeout_s + 5)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.wait(1.0 / self.rate):
                case = make_case(self.rng)
                headers = {"Content-Type": case.content_type}
                if case.admin:
                    headers["Authorization"] = f"Bearer {self.admin_key}"
                try:
                    r = client.post(self.url + case.path, content=case.body, headers=headers)
                except httpx.TimeoutException:
                    key, bad, status = "timeout", False, "timeout"
                except httpx.HTTPError:
                    key, bad, status = "connection", False, "connection"
                else:
                    key, status = status_key(r.status_code), str(r.status_code)
                    bad = response_malformed(case.path, r.status_code, r.headers.get("content-type", ""), r.content)
                    wait = queue_wait_of(r.headers.get(QUEUE_WAIT_HEADER))
                    if case.path == SCORE_TREES_PATH and wait is not None:
                        self.score_waits.append((self.clock(), wait, r.status_code))
                per_kind = self.statuses.setdefault(case.kind, {})
                per_kind[status] = per_kind.get(status, 0) + 1
                self.record(key, bad)
