"""Live-traffic spool: the traces of the requests the server serves, kept for training (opt-in, admin key to read).

Off unless the server config sets ``traffic_spool_mb > 0`` (carried to every server process as
``SPECOPD_TRAFFIC_SPOOL_BYTES`` by :func:`sglang_specopd.server.plugin.launch_environment`). When on, the SPECOPD (or
SPECOPD_DSPARK) worker keeps every request's verify records (:func:`sglang_specopd.server.traces.record_verify_step`
with ``keep_all``), and when a request finishes (finish reason ``stop`` or ``length``; aborted ones are dropped) the
output streamer calls :func:`record_finished`, which appends one item to :class:`TrafficSpool`, a ring buffer in the
scheduler process with a byte budget::

    {"seq": int, "input_ids": prompt ids + output ids (as served), "prompt_len": int,
     "trace": [{"anchor", "proposed", "accepted", "drafter_version"}, ...], "finished_at": Unix seconds,
     "features": {"start": int, "rows": int}}   # only when context features were captured while serving

Features (``traffic_features_mb > 0``, :mod:`sglang_specopd.server.traffic.features`) are held in their own
byte-bounded ring beside the spool, keyed by ``seq``, and read with op ``traffic`` action ``features``.

A request sent with ``custom_params: {"specopd_spool": false}`` is never kept (measurement requests, or users who
did not agree to their traffic being used for training); any other value of that key is refused with HTTP 400.
Nor is SGLang's own health-check generation (``GET /health``, ``/health_generate``: rid ``HEALTH_CHECK_...``), which
a router in front of the server (``specopd fleet``) sends every worker periodically.

Why in the scheduler: it holds the exact prompt ids (``origin_input_ids``) and served output ids
(``output_ids_through_stop``), and the records of requests that did not ask for a trace never leave it (they are
never put into ``meta_info``), so nothing has to be stripped from users' replies. Reads go through the plugin's
control channel (op ``traffic``, run between batches).

Bounds: an item's size is the length of its compact JSON encoding (what is held, to within ~100 bytes of Python
object overhead per item); adding one evicts the oldest items until the total fits the budget (counted in
``evicted``); an item larger than the whole budget is dropped (``dropped_oversize``). One read returns at most
:data:`~sglang_specopd.wire.traffic.MAX_ITEMS_PER_READ` items and about
:data:`~sglang_specopd.wire.traffic.MAX_REPLY_BYTES` bytes. Wire models: :mod:`sglang_specopd.wire.traffic`.
"""

from __future__ import annotations

import bisect
import json
import os
import time
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence

from sglang_specopd.server.traffic.optout import SPOOL_PARAM, opted_out  # noqa: F401 (SPOOL_PARAM re-exported)
from sglang_specopd.wire.traffic import (DEFAULT_ITEMS_PER_READ, MAX_ITEMS_PER_READ, MAX_REPLY_BYTES, budget_env,
                                         budget_from_env)

SPOOL_BYTES_ENV = "SPECOPD_TRAFFIC_SPOOL_BYTES"
OFF_REASON = ("live-traffic recording is off on this server (set traffic_spool_mb > 0 in its server config; "
              "docs/live_traffic.md)")
_RECORDED_ATTR = "_specopd_traffic_recorded"
#: The plugin's algorithms, whose workers record traces: SPECOPD (DFlash / V2 drafters), SPECOPD_DSPARK (DSpark).
RECORDING_ALGORITHMS = ("SPECOPD", "SPECOPD_DSPARK")


def check_spool_param(custom_params: Any) -> None:
    """Raise ``ValueError`` (HTTP 400) if ``custom_params["specopd_spool"]`` is present and not a JSON boolean."""
    from sglang_specopd.server.traces import check_bool_param

    check_bool_param(custom_params, SPOOL_PARAM)


def verify_spool_param(result: Any, sampling_params: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook on SGLang's ``SamplingParams.verify`` (HTTP process): :func:`check_spool_param`."""
    check_spool_param(getattr(sampling_params, "custom_params", None))
    return result


def health_check(req: Any) -> bool:
    """True for SGLang's health-check generation (``/health``, ``/health_generate``): not traffic to learn from."""
    from sglang_specopd.server import compat

    rid = getattr(req, "rid", None)
    return isinstance(rid, str) and rid.startswith(compat.get("HEALTH_CHECK_RID_PREFIX"))


def spool_budget_bytes(environ: Optional[Mapping[str, str]] = None) -> int:
    """The spool's byte budget from ``SPECOPD_TRAFFIC_SPOOL_BYTES`` (unset or 0: recording off).
    Raises ValueError when the variable is not an integer >= 0."""
    return budget_from_env(SPOOL_BYTES_ENV, os.environ if environ is None else environ)


def spool_env(traffic_spool_mb: float) -> Dict[str, str]:
    """The environment that carries ``traffic_spool_mb`` (MiB, fractions allowed) to the server's processes."""
    return budget_env(SPOOL_BYTES_ENV, "traffic_spool_mb", traffic_spool_mb)


def _compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class TrafficSpool:
    """Ring buffer of encoded traffic items under a byte budget; readers page with a cursor (``seq``).

    Items are stored as their JSON bytes (so :meth:`read` is a concatenation and the budget counts what is held).
    ``seq`` numbers start at 1 and grow by one per :meth:`add` (an oversize item uses a number too, so readers see
    it as missed); eviction pops from the oldest end; :meth:`purge` drops everything but keeps numbering.
    """

    def __init__(self, budget_bytes: int, *, spool_id: Optional[str] = None, clock=time.time):
        if budget_bytes <= 0:
            raise ValueError(f"the traffic spool needs a budget > 0 bytes, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self.spool_id = spool_id or uuid.uuid4().hex
        self._clock = clock
        self._seqs: List[int] = []
        self._data: List[bytes] = []
        self._head = 0  # index of the oldest live item in _seqs/_data
        self.bytes = 0
        self.last_seq = 0
        self.counts = {"recorded": 0, "evicted": 0, "dropped_oversize": 0, "purged": 0}

    def __len__(self) -> int:
        return len(self._seqs) - self._head

    def add(self, input_ids: Sequence[int], prompt_len: int, trace: List[dict],
            finished_at: Optional[float] = None, features: Optional[Dict[str, int]] = None) -> Optional[int]:
        """Append one item; returns its seq, or None when it alone exceeds the budget (dropped, counted).

        Args:
            input_ids: prompt ids followed by the served output ids (ints).
            prompt_len: how many of ``input_ids`` are the prompt (0 <= prompt_len <= len(input_ids)).
            trace: the request's verify records (:mod:`sglang_specopd.server.traces`), JSON-serialisable.
            finished_at: Unix time in seconds (default: now).
            features: ``{"start", "rows"}`` when the target's context features of this item are held beside the
                spool (:mod:`sglang_specopd.server.traffic.features`), else None (the key is left out).
        """
        if not 0 <= prompt_len <= len(input_ids):
            raise ValueError(f"prompt_len {prompt_len} outside 0..{len(input_ids)}")
        self.last_seq += 1
        seq = self.last_seq
        item = {"seq": seq, "input_ids": [int(t) for t in input_ids], "prompt_len": int(prompt_len),
                "trace": trace, "finished_at": float(self._clock() if finished_at is None else finished_at)}
        if features is not None:
            item["features"] = {"start": int(features["start"]), "rows": int(features["rows"])}
        data = _compact(item)
        if len(data) > self.budget_bytes:
            self.counts["dropped_oversize"] += 1
            return None
        while self.bytes + len(data) > self.budget_bytes:
            self._pop_oldest()
            self.counts["evicted"] += 1
        self._seqs.append(seq)
        self._data.append(data)
        self.bytes += len(data)
        self.counts["recorded"] += 1
        return seq

    def _pop_oldest(self) -> None:
        self.bytes -= len(self._data[self._head])
        self._data[self._head] = b""
        self._head += 1
        if self._head > 1024 and self._head * 2 > len(self._seqs):  # compact: amortised O(1) per pop
            del self._seqs[:self._head], self._data[:self._head]
            self._head = 0

    def purge(self) -> int:
        """Drop every item (numbering goes on); returns how many were dropped."""
        n = len(self)
        self._seqs, self._data, self._head, self.bytes = [], [], 0, 0
        self.counts["purged"] += n
        return n

    def stats(self) -> Dict[str, int]:
        """:class:`sglang_specopd.wire.traffic.TrafficStats` as a dict."""
        return {"items": len(self), "bytes": self.bytes, "budget_bytes": self.budget_bytes, **self.counts,
                "oldest_seq": self._seqs[self._head] if len(self) else 0, "newest_seq": self.last_seq}

    def read(self, after: int = 0, max_items: int = DEFAULT_ITEMS_PER_READ, spool_id: Optional[str] = None,
             max_bytes: int = MAX_REPLY_BYTES) -> bytes:
        """The JSON bytes of a :class:`sglang_specopd.wire.traffic.TrafficReply`: up to ``max_items`` items with
        ``seq > after``, oldest first, at most ``max_bytes`` of items (at least one). Nothing is removed.

        ``spool_id``: the id the cursor came from; a different one (the server restarted) reads from ``after=0``.
        Raises ValueError when ``after`` is beyond the newest seq of this spool or ``max_items`` is outside
        1..MAX_ITEMS_PER_READ.
        """
        if not 1 <= max_items <= MAX_ITEMS_PER_READ:
            raise ValueError(f"max_items must be in 1..{MAX_ITEMS_PER_READ}, got {max_items}")
        if spool_id is not None and spool_id != self.spool_id:
            after = 0
        if not 0 <= after <= self.last_seq:
            raise ValueError(f"after={after} is outside 0..{self.last_seq} (the newest item of spool {self.spool_id})")
        start = bisect.bisect_right(self._seqs, after, lo=self._head)
        chosen: List[bytes] = []
        size = 0
        i = start
        while i < len(self._seqs) and len(chosen) < max_items:
            if chosen and size + len(self._data[i]) > max_bytes:
                break
            chosen.append(self._data[i])
            size += len(self._data[i])
            i += 1
        next_after = self._seqs[i - 1] if chosen else self.last_seq
        missed = next_after - after - len(chosen)
        return (b'{"spool_id":' + _compact(self.spool_id) + b',"items":[' + b",".join(chosen)
                + b'],"next_after":%d,"missed":%d,"stats":' % (next_after, missed) + _compact(self.stats()) + b"}")


_SPOOL: Optional[TrafficSpool] = None
_OFF = False  # the environment was read and recording is off (not read again: record_finished runs every batch)


def spool() -> Optional[TrafficSpool]:
    """This process's spool (created on first use from the environment); None when recording is off."""
    global _SPOOL, _OFF
    if _SPOOL is None and not _OFF:
        budget = spool_budget_bytes()
        if budget > 0:
            _SPOOL = TrafficSpool(budget)
        else:
            _OFF = True
    return _SPOOL


def recording() -> bool:
    """True when this server records live traffic (``SPECOPD_TRAFFIC_SPOOL_BYTES`` > 0)."""
    return spool() is not None


def record_finished(reqs: Sequence[Any]) -> int:
    """Scheduler side, from the output streamer: spool every request in ``reqs`` that has just finished with
    reason ``stop`` or ``length`` (once per request). Returns how many were spooled (0 when recording is off)."""
    from sglang_specopd.server.traces import take_all
    from sglang_specopd.server.traffic.features import discard, store_finished

    sp = spool()
    if sp is None:
        return 0
    n = 0
    for req in reqs:
        if not req.finished() or getattr(req, _RECORDED_ATTR, False):
            continue
        setattr(req, _RECORDED_ATTR, True)
        trace = take_all(req)
        reason = req.finished_reason.to_json() if req.finished_reason is not None else {}
        if reason.get("type") not in ("stop", "length") or opted_out(req) or health_check(req):
            discard(req)
            continue
        prompt = list(req.origin_input_ids)
        ids = prompt + list(req.output_ids_through_stop)
        features = store_finished(req, sp.last_seq + 1, len(ids))  # kept under the seq add() assigns next
        sp.add(ids, len(prompt), trace, features=features)
        n += 1
    return n


def parse_read_query(query: Mapping[str, str]) -> Dict[str, Any]:
    """``GET /specopd/traffic`` query -> ``{"after", "max_items", "spool_id"}``; ValueError (HTTP 400) with the
    reason for an unknown parameter or a value that is not an integer in range."""
    unknown = sorted(set(query) - {"after", "max_items", "spool_id"})
    if unknown:
        raise ValueError(f"unknown query parameter(s) {unknown[:5]} (allowed: after, max_items, spool_id)")
    out: Dict[str, Any] = {"spool_id": query.get("spool_id") or None}
    for name, default, low, high in (("after", 0, 0, 2**62), ("max_items", DEFAULT_ITEMS_PER_READ, 1,
                                                                         MAX_ITEMS_PER_READ)):
        raw = query.get(name)
        try:
            value = default if raw is None else int(raw)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {raw[:40]!r}") from None
        if not low <= value <= high:
            raise ValueError(f"{name} must be in {low}..{high}, got {value}")
        out[name] = value
    return out


def traffic_op(scheduler, payload: bytes):
    """Scheduler op ``traffic``: ``{"action": "read", "after", "max_items", "spool_id"}`` -> a TrafficReply,
    ``{"action": "purge"}`` -> a PurgeReply. 404 when recording is off, 409 on a server that is neither SPECOPD nor
    SPECOPD_DSPARK."""
    sp = spool()
    if sp is None:
        return 404, OFF_REASON, b""
    algo = str(getattr(scheduler.server_args, "speculative_algorithm", None) or "").upper()
    if algo not in RECORDING_ALGORITHMS:
        return 409, (f"live-traffic recording needs a SPECOPD server (this one serves speculative_algorithm="
                     f"{algo or 'none'}): no traces to record"), b""
    req = json.loads(payload)
    if req.get("action") == "purge":
        from sglang_specopd.server.traffic.features import ring

        n = sp.purge()
        if ring() is not None:
            ring().clear()
        return 200, "ok", _compact({"purged": n, "stats": sp.stats()})
    if req.get("action") == "features":
        from sglang_specopd.server.traffic.features import OFF_REASON as FEATURES_OFF, features_reply, ring

        if ring() is None:
            return 404, FEATURES_OFF, b""
        spool_id = req.get("spool_id")
        if spool_id is not None and spool_id != sp.spool_id:
            return 409, (f"spool_id {str(spool_id)[:40]!r} is not this server's spool ({sp.spool_id}): the server "
                         f"restarted, the items of that spool are gone"), b""
        return 200, "ok", features_reply(req["seqs"], sp.spool_id)
    return 200, "ok", sp.read(int(req["after"]), int(req["max_items"]), req.get("spool_id"))


def register_traffic_op() -> None:
    """Register the ``traffic`` scheduler op (:mod:`sglang_specopd.server.control`)."""
    from sglang_specopd.server.control import op

    op("traffic")(traffic_op)
