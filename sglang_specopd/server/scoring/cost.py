"""What a ``/specopd/score_trees`` request may cost, decided before any work starts (no SGLang, no torch).

:class:`ScoreSettings` are the server-config keys that bound scoring (``score_trees_budget_tokens``,
``score_trees_queue_max``, ``score_trees_max_request_mb``, ``score_trees_queue_wait_s``: the longest a request
waits for its turn, :mod:`sglang_specopd.server.scoring.line`), passed to every server process as environment
variables by :func:`sglang_specopd.server.plugin.launch_environment`. :func:`estimate_cost` counts a request's
tokens, nodes, anchors and returned bytes and estimates the scheduler's peak memory for it from the target's
dimensions (:class:`TargetDims`); :func:`over_limits` names what exceeds a limit (HTTP 413 with the numbers).

The memory estimate (bytes) is deliberately simple and on the high side:
  prefix K/V        L * P * Hkv * D * 2 * act   (every layer's K/V of the largest reference, as recorded for
                                                 chunks / the prefix cache)
  forward rows      R * (4 H + 3 I + (Hq + 2 Hkv) D) * act, R = the rows of the largest single forward
                    (P + N unchunked, at most the token budget when chunked)
  tree attention    G_R * (P + M) * (Hkv * D * 2 * act + M * Hq * 4): each anchor group's keys/values and fp32
                    scores (G_R groups of M nodes in the largest forward)
  logits            R_head * V * 4 * 3 (logits, log-probs, top-k work), R_head = rows of one head block
  GDN states        (P // 64 + 1 + A + N) * S * 4 on hybrid GDN targets (S values per state; counted against the
                    tree-attention term, the larger of the two, since the layers run one at a time)
  returned          3 * the returned tensors (the tensors, their safetensors bytes and the IPC copy)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

BUDGET_ENV = "SPECOPD_SCORE_BUDGET_TOKENS"
QUEUE_MAX_ENV = "SPECOPD_SCORE_QUEUE_MAX"
MAX_REQUEST_MB_ENV = "SPECOPD_SCORE_MAX_REQUEST_MB"
QUEUE_WAIT_ENV = "SPECOPD_SCORE_QUEUE_WAIT_S"
DEFAULT_QUEUE_MAX = 4
DEFAULT_MAX_REQUEST_MB = 1024
DEFAULT_QUEUE_WAIT_S = 10.0


@dataclass(frozen=True)
class ScoreSettings:
    """``budget_tokens``: rows of scoring forward per scheduler iteration (0 = off: a request runs whole, between
    two batches); ``queue_max``: requests that may wait while one is scored (more get HTTP 429);
    ``max_request_mb``: cap on a request's estimated peak scheduler memory in MiB (0 = no cap; more gets 413);
    ``queue_wait_s``: the longest a request waits for its turn, in seconds (0 = no bound; longer gets 429)."""

    budget_tokens: int = 0
    queue_max: int = DEFAULT_QUEUE_MAX
    max_request_mb: int = DEFAULT_MAX_REQUEST_MB
    queue_wait_s: float = DEFAULT_QUEUE_WAIT_S

    def __post_init__(self):
        for name in ("budget_tokens", "queue_max", "max_request_mb", "queue_wait_s"):
            value = getattr(self, name)
            if not value >= 0 or value == float("inf"):  # NaN fails the comparison
                raise ValueError(f"score_trees {name} must be a finite number >= 0, got {value}")

    def env(self) -> Dict[str, str]:
        """The environment variables that carry these settings to the server's processes."""
        return {BUDGET_ENV: str(self.budget_tokens), QUEUE_MAX_ENV: str(self.queue_max),
                MAX_REQUEST_MB_ENV: str(self.max_request_mb), QUEUE_WAIT_ENV: repr(float(self.queue_wait_s))}

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "ScoreSettings":
        """Read the settings (unset: the defaults). Raises ValueError naming a variable that is not a number >= 0
        (an integer, except the queue wait)."""
        environ = os.environ if environ is None else environ
        values = {}
        for field, var, default, kind in (("budget_tokens", BUDGET_ENV, 0, int),
                                          ("queue_max", QUEUE_MAX_ENV, DEFAULT_QUEUE_MAX, int),
                                          ("max_request_mb", MAX_REQUEST_MB_ENV, DEFAULT_MAX_REQUEST_MB, int),
                                          ("queue_wait_s", QUEUE_WAIT_ENV, DEFAULT_QUEUE_WAIT_S, float)):
            raw = environ.get(var, "").strip()
            try:
                values[field] = kind(raw) if raw else default
            except ValueError:
                raise ValueError(f"{var} must be {'an integer' if kind is int else 'a number'}, got {raw!r}") from None
        return cls(**values)


@dataclass(frozen=True)
class TargetDims:
    """The served target's sizes: layers, hidden H, MLP intermediate I, query / KV heads, head dim D, vocabulary V,
    bytes per activation element (2 for bf16, 4 for fp32) and the context length; for hybrid Gated DeltaNet
    targets the GDN layer count and the values of one GDN state (HV x Dv x Dk); ``unscorable``: why the endpoint
    cannot score this target ("" when it can; :mod:`sglang_specopd.server.scoring.gdn`)."""

    num_layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    act_bytes: int
    context_len: int = 0
    gdn_layers: int = 0
    gdn_state_values: int = 0
    unscorable: str = ""


@dataclass(frozen=True)
class RequestCost:
    """A request's size (totals over its references) and its estimated peak scheduler memory in bytes."""

    references: int
    tokens: int
    nodes: int
    anchors: int
    feature_bytes: int
    returned_bytes: int
    peak_bytes: int

    def describe(self) -> str:
        mib = 2**20
        return (f"{self.references} references, {self.tokens} tokens, {self.nodes} nodes, {self.anchors} anchors, "
                f"{self.feature_bytes / mib:.1f} MiB of features, {self.returned_bytes / mib:.1f} MiB returned, "
                f"estimated peak scheduler memory {self.peak_bytes / mib:.1f} MiB")


def _returned_per_row(req, dims: TargetDims) -> int:
    out = 2 if req.output_dtype == "bfloat16" else 4
    n = 0
    if "topk" in req.returns:
        n += min(req.top_k, dims.vocab) * (8 + out) + 4
    if "hidden" in req.returns:
        n += dims.hidden * out
    if "logprobs" in req.returns:
        n += dims.vocab * out
    return n


def estimate_cost(req, dims: TargetDims, budget_tokens: int = 0) -> RequestCost:
    """Count ``req`` (a :class:`sglang_specopd.wire.protocol.ScoreTreesRequest`) and estimate its peak scheduler
    memory (module docstring) when scored with ``budget_tokens`` rows per piece (0: one forward per reference;
    always 0 on a hybrid GDN target, whose references run whole)."""
    if dims.gdn_layers:
        budget_tokens = 0
    out_bytes = 2 if req.output_dtype == "bfloat16" else 4
    per_row = _returned_per_row(req, dims)
    tokens = nodes = anchors = feature_bytes = returned = 0
    kv_peak = fwd_peak = attn_peak = head_rows = 0
    d = dims
    for ref in req.references:
        P, A = len(ref.input_ids), len(ref.trees)
        sizes: List[int] = [len(t.flat()[0]) for t in ref.trees]
        N = sum(sizes)
        M = max(sizes, default=0)
        G = sum(1 for n in sizes if n)
        tokens, nodes, anchors = tokens + P, nodes + N, anchors + A
        feats = P * len(req.feature_layer_ids) * d.hidden * out_bytes
        feature_bytes += feats
        returned += (A + N) * per_row + feats + N * 8
        kv_peak = max(kv_peak, d.num_layers * P * d.kv_heads * d.head_dim * 2 * d.act_bytes)
        chunked = 0 < budget_tokens < P + N
        rows = min(P + N, budget_tokens) if chunked else P + N
        groups = min(G, max(1, budget_tokens)) if chunked else G
        fwd_peak = max(fwd_peak, rows * (4 * d.hidden + 3 * d.intermediate
                                         + (d.q_heads + 2 * d.kv_heads) * d.head_dim) * d.act_bytes)
        attn_peak = max(attn_peak, groups * (P + M) * (d.kv_heads * d.head_dim * 2 * d.act_bytes + M * d.q_heads * 4))
        if d.gdn_layers:  # one GDN layer's fp32 states at a time: chunk boundaries, anchors, the widest level (<= N)
            attn_peak = max(attn_peak, (P // 64 + 1 + A + N) * d.gdn_state_values * 4)
        head_rows = max(head_rows, min(A + N, max(A, budget_tokens)) if chunked else A + N)
    logits = head_rows * d.vocab * 4 * 3 if ("topk" in req.returns or "logprobs" in req.returns) else 0
    peak = kv_peak + fwd_peak + attn_peak + logits + 3 * returned
    return RequestCost(len(req.references), tokens, nodes, anchors, feature_bytes, returned, peak)


def over_limits(cost: RequestCost, settings: ScoreSettings) -> Optional[str]:
    """None if ``cost`` fits every limit, else one line: what exceeds which limit, and the request's numbers."""
    from sglang_specopd.wire.protocol import MAX_REQUEST_ANCHORS, MAX_REQUEST_NODES, MAX_REQUEST_TOKENS

    problems = [f"{what} {got} > limit {cap}" for what, got, cap in (
        ("tokens", cost.tokens, MAX_REQUEST_TOKENS), ("nodes", cost.nodes, MAX_REQUEST_NODES),
        ("anchors", cost.anchors, MAX_REQUEST_ANCHORS)) if got > cap]
    cap = settings.max_request_mb * 2**20
    if settings.max_request_mb and cost.peak_bytes > cap:
        problems.append(f"estimated peak scheduler memory {cost.peak_bytes / 2**20:.1f} MiB > "
                        f"score_trees_max_request_mb {settings.max_request_mb} MiB")
    if not problems:
        return None
    return "score_trees request too large: " + "; ".join(problems) + f" (request: {cost.describe()})"
