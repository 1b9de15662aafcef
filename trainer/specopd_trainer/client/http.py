"""Typed HTTP client for a live sglang-specopd server (the trainer's only way to reach the target).

Retries connection errors and 5xx/503 with exponential backoff, then raises :class:`ServerUnavailableError`;
429 (the server's score queue is full) is retried after the server's ``Retry-After`` (or the backoff), at most
``busy_retries`` times, then raises :class:`ServerBusyError`; other 4xx replies raise :class:`ServerRequestError`
with the server's reason (never retried).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import httpx

from sglang_specopd.wire.protocol import (
    ADMIN_KEY_HEADER,
    BINARY_CONTENT_TYPE,
    SCORE_TREES_PATH,
    ScoreTreesRequest,
    decode_tensors,
    privileged_parts,
)
from sglang_specopd.wire.traffic import (
    TRAFFIC_FEATURES_PATH,
    TRAFFIC_PATH,
    TRAFFIC_PURGE_PATH,
    PurgeReply,
    TrafficReply,
)


class ServerError(RuntimeError):
    """Base class for errors talking to the server."""


class ServerUnavailableError(ServerError):
    """The server could not be reached or kept failing after all retries. ``status``: the HTTP status (5xx) of the
    last attempt, None when the last attempt got no HTTP answer (connection refused or reset, timeout)."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.status = status


class ServerRequestError(ServerError):
    """The server rejected the request (HTTP 4xx); ``status`` and the server's ``reason`` are attached."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"HTTP {status}: {reason}")
        self.status = status
        self.reason = reason


class ServerBusyError(ServerRequestError):
    """The server kept answering 429 (its queue was full) after every allowed retry; ``retry_after`` is its
    last ``Retry-After`` in seconds (None if it sent none)."""

    def __init__(self, reason: str, retry_after: Optional[float]):
        super().__init__(429, reason)
        self.retry_after = retry_after


def retry_after_seconds(r: httpx.Response) -> Optional[float]:
    """The ``Retry-After`` header in seconds (the delta-seconds form), or None when absent or not a number."""
    raw = r.headers.get("retry-after", "").strip()
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


@dataclass
class ScoredReference:
    """Scores for one reference. Rows: anchors first (len A), then nodes (len N) in request order.

    ``topk_ids`` int64 [A+N, k], ``topk_logprobs`` [A+N, k], ``lse`` fp32 [A+N] (log-sum-exp of raw logits),
    ``hidden`` [A+N, H] (final normed hidden state), ``logprobs`` [A+N, V], ``features`` [P, K*H] (target
    context features), ``node_anchor`` int64 [N] (index of each node's anchor). Absent fields are None.
    ``prefix_cache``: "hit" (the server reused this prefix's K/V from an earlier call), "miss" or "off".
    """

    num_anchors: int
    num_nodes: int
    prefix_len: int
    node_anchor: Any
    topk_ids: Any = None
    topk_logprobs: Any = None
    lse: Any = None
    hidden: Any = None
    logprobs: Any = None
    features: Any = None
    prefix_cache: str = "off"


def _reason(r: httpx.Response) -> str:
    """The server's reason in an error reply."""
    try:
        body = r.json()
        err = body.get("error") if isinstance(body, dict) else None
        # ours: {"error": {"message": ...}}; SGLang's auth middleware: {"error": "Unauthorized"}
        reason = ((err.get("message") if isinstance(err, dict) else err)
                  or (body.get("message") if isinstance(body, dict) else None) or r.text)
    except ValueError:
        reason = r.text
    return str(reason)


def _safetensors_metadata(data: bytes) -> Dict[str, str]:
    """The ``__metadata__`` of safetensors bytes (header: 8-byte little-endian length, then JSON)."""
    import json
    import struct

    if len(data) < 8:
        raise ServerError("safetensors reply shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ServerError("safetensors reply: header longer than the body")
    return json.loads(data[8:8 + n]).get("__metadata__") or {}


class SpecOPDClient:
    """Client for generation, acceptance statistics and tree scoring on one server."""

    def __init__(self, url: str, *, api_key: Optional[str] = None, admin_api_key: Optional[str] = None,
                 timeout: float = 600.0, retries: int = 4, backoff_s: float = 1.0, busy_retries: int = 8,
                 max_retry_after_s: float = 60.0):
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.busy_retries = busy_retries  # 429 retries (separate from the error retries)
        self.max_retry_after_s = max_retry_after_s  # a longer Retry-After is waited this long
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._admin_key = admin_api_key
        self._http = httpx.Client(timeout=timeout, headers=headers)
        self._traffic_cursor: Optional[Tuple[str, int]] = None  # (spool_id, last seq read) of the traffic spool
        self.last_traffic: Optional[TrafficReply] = None  # the last /specopd/traffic reply (missed, stats)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "SpecOPDClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        last: Optional[Exception] = None
        last_status: Optional[int] = None
        attempt = busy = 0
        while True:
            try:
                r = self._http.request(method, self.url + path, **kwargs)
            except httpx.TransportError as exc:
                last, last_status = exc, None
            else:
                if r.status_code == 429:
                    wait = retry_after_seconds(r)
                    if busy >= self.busy_retries:
                        raise ServerBusyError(f"{_reason(r)} (still busy after {busy + 1} attempts)", wait)
                    busy += 1
                    time.sleep(min(self.max_retry_after_s, wait if wait is not None else self.backoff_s * 2**busy))
                    continue
                if r.status_code < 500:
                    if r.status_code >= 400:
                        raise ServerRequestError(r.status_code, _reason(r))
                    return r
                last, last_status = ServerError(f"HTTP {r.status_code}: {r.text[:300]}"), r.status_code
            if attempt >= self.retries:
                break
            time.sleep(self.backoff_s * 2**attempt)
            attempt += 1
        raise ServerUnavailableError(f"{method} {self.url}{path} failed after {self.retries + 1} attempts: {last}",
                                     last_status)

    def generate(self, input_ids: List[int], *, max_new_tokens: int, temperature: float = 0.0,
                 trace: bool = False, **sampling) -> Dict[str, Any]:
        """``/generate`` for one prompt; returns SGLang's JSON (``output_ids``, ``meta_info`` with acceptance stats)."""
        params = {"max_new_tokens": max_new_tokens, "temperature": temperature, **sampling}
        if trace:
            params["custom_params"] = {**(params.get("custom_params") or {}), "specopd_trace": True}
        return self._request("POST", "/generate", json={"input_ids": input_ids, "sampling_params": params}).json()

    def score_trees(self, req: ScoreTreesRequest) -> List[ScoredReference]:
        """``POST /specopd/score_trees``; one :class:`ScoredReference` per request reference; the admin key goes
        with a request for hidden states or features (admin-only: :mod:`sglang_specopd.server.scoring.auth`)."""
        headers = {"Content-Type": "application/json"}
        if self._admin_key and privileged_parts(req):
            headers[ADMIN_KEY_HEADER] = self._admin_key
        r = self._request("POST", SCORE_TREES_PATH, content=req.model_dump_json(), headers=headers)
        if not r.headers.get("content-type", "").startswith(BINARY_CONTENT_TYPE):
            raise ServerError(f"unexpected content type {r.headers.get('content-type')!r}")
        tensors, header = decode_tensors(r.content)
        out = []
        for i, meta in enumerate(header["references"]):
            p = f"ref{i}."
            out.append(ScoredReference(
                num_anchors=meta["num_anchors"], num_nodes=meta["num_nodes"], prefix_len=meta["prefix_len"],
                node_anchor=tensors[p + "node_anchor"], prefix_cache=meta.get("prefix_cache", "off"),
                **{k: tensors.get(p + k) for k in ("topk_ids", "topk_logprobs", "lse", "hidden", "logprobs",
                                                    "features")}))
        return out

    def prefix_cache(self, clear: bool = False) -> Dict[str, int]:
        """The server's score_trees prefix cache stats (entries, bytes, budget_bytes, hits, misses, evictions);
        ``clear=True`` empties it first (admin: needs ``admin_api_key``)."""
        from sglang_specopd.wire.protocol import PREFIX_CACHE_PATH

        if not clear:
            return self._request("GET", PREFIX_CACHE_PATH).json()
        return self._request("POST", PREFIX_CACHE_PATH + "/clear", headers=self._admin_headers()).json()

    def _admin_headers(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self._admin_key}"} if self._admin_key else {}

    def admin_request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One request to an admin route (the admin key as bearer), with this client's retries and errors."""
        headers = {**self._admin_headers(), **(kwargs.pop("headers", None) or {})}
        return self._request(method, path, headers=headers, **kwargs)

    def drafter_info(self) -> Dict[str, Any]:
        """``GET /specopd/drafter``: ``{"version", "swaps", "has_drafter", "arch", "spec", "name", "staged"}``."""
        from sglang_specopd.wire.protocol import DRAFTER_INFO_PATH

        return self._request("GET", DRAFTER_INFO_PATH).json()

    def traffic(self, max_items: int) -> List[Dict[str, Any]]:
        """The next up to ``max_items`` (1..4096) live-traffic items this client has not read yet, oldest first
        (``GET /specopd/traffic``, admin: needs ``admin_api_key``). Each item is exactly ``{"input_ids": [int]
        (prompt + served output ids), "prompt_len": int, "trace": [{"anchor", "proposed", "accepted",
        "drafter_version"}], "finished_at": float (Unix s)}``; [] when nothing new has finished.

        The client keeps the cursor (spool id + last seq): every item is returned once per client, and a retried
        request after a lost reply returns the same items (the server removes nothing on read). Items evicted
        before they were read are counted in ``self.last_traffic.missed``; after a server restart the cursor starts
        again. Raises :class:`ServerRequestError`: 401/403 without the admin key, 404 when the server does not
        record traffic (``traffic_spool_mb: 0``), 409 on a server that is not SPECOPD.
        """
        params: Dict[str, Any] = {"max_items": int(max_items)}
        if self._traffic_cursor is not None:
            params["spool_id"], params["after"] = self._traffic_cursor
        r = self._request("GET", TRAFFIC_PATH, params=params, headers=self._admin_headers())
        reply = TrafficReply.model_validate_json(r.content)
        self.last_traffic = reply
        self._traffic_cursor = (reply.spool_id, reply.next_after)
        return [{"input_ids": list(it.input_ids), "prompt_len": it.prompt_len,
                 "trace": [rec.model_dump() for rec in it.trace], "finished_at": it.finished_at, "seq": it.seq}
                for it in reply.items]

    def traffic_page(self, after: int, spool_id: Optional[str], max_items: int) -> Dict[str, Any]:
        """One raw ``GET /specopd/traffic`` reply as parsed JSON (admin), items NOT validated: a reader that must
        survive a malformed item (``specopd_trainer.adapt.reader``) validates each one itself. ``after``/``spool_id``:
        the cursor of the previous page (0 / None for the start). Raises :class:`ServerRequestError` as
        :meth:`traffic`, :class:`ServerError` when the reply is not a JSON object."""
        params: Dict[str, Any] = {"max_items": int(max_items), "after": int(after)}
        if spool_id is not None:
            params["spool_id"] = spool_id
        r = self._request("GET", TRAFFIC_PATH, params=params, headers=self._admin_headers())
        try:
            reply = r.json()
        except ValueError as exc:
            raise ServerError(f"{TRAFFIC_PATH}: reply is not JSON ({exc})") from None
        if not isinstance(reply, dict):
            raise ServerError(f"{TRAFFIC_PATH}: reply is not a JSON object")
        return reply

    def traffic_features(self, seqs: List[int], spool_id: Optional[str] = None):
        """Context features captured while serving traffic items ``seqs`` (<= 64; ``GET /specopd/traffic/features``,
        admin). Returns ``({seq: (start, bf16 tensor [rows, K*H])}, [seqs without features])``: rows for positions
        ``start .. start + rows - 1`` of the item's ``input_ids``. Raises :class:`ServerRequestError`: 404 when the
        server does not capture features, 409 when ``spool_id`` is not the server's (it restarted)."""
        import json

        from safetensors.torch import load as load_safetensors

        params: Dict[str, Any] = {"seqs": ",".join(str(int(s)) for s in seqs)}
        if spool_id is not None:
            params["spool_id"] = spool_id
        r = self._request("GET", TRAFFIC_FEATURES_PATH, params=params, headers=self._admin_headers())
        tensors = load_safetensors(r.content)
        meta = _safetensors_metadata(r.content)
        start = json.loads(meta.get("start", "{}"))
        missing = [int(s) for s in json.loads(meta.get("missing", "[]"))]
        out = {int(k.split(".", 1)[1]): (int(start[k.split(".", 1)[1]]), v) for k, v in tensors.items()}
        return out, missing

    def purge_traffic(self) -> int:
        """Drop every live-traffic item held by the server (``POST /specopd/traffic/purge``, admin); returns how many
        were dropped. Raises :class:`ServerRequestError` as :meth:`traffic`."""
        r = self._request("POST", TRAFFIC_PURGE_PATH, headers=self._admin_headers())
        return PurgeReply.model_validate_json(r.content).purged

    def context_features(self, input_ids: List[int], layer_ids: List[int], dtype: str = "float32"):
        """Target context features [P, K*H] for one sequence (SGLang's DFlash capture convention)."""
        req = ScoreTreesRequest(references=[{"input_ids": input_ids}], block_size=2, returns=[],
                                feature_layer_ids=list(layer_ids), output_dtype=dtype)
        return self.score_trees(req)[0].features
