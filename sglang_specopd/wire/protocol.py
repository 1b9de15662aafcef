"""Wire protocol between the trainer and the plugin's routes: request models and the binary tensor codec.

Both sides import this module, so the client and the server cannot drift apart. Small structured data travels
as JSON (strict pydantic models, unknown keys rejected); tensors travel as safetensors bytes whose
``__metadata__`` carries a JSON header (:func:`encode_tensors` / :func:`decode_tensors`).

Proposal trees follow the layout in the shared algorithm notes: a reference sequence ``input_ids`` (prompt +
reference response, length P); per anchor position ``a`` (0 <= a < P, the last verified token) either K chain
branches of draft tokens (each of length <= block_size - 1) or a general tree given by ``tokens`` + ``parents``
(parent -1 = child of the anchor; parents point to earlier nodes only). Node at depth m sits at position a+1+m.
"""

from __future__ import annotations

import json
from typing import Callable, Dict, List, Literal, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCORE_TREES_PATH = "/specopd/score_trees"
SWAP_DRAFTER_PATH = "/specopd/drafter/swap"
DRAFTER_INFO_PATH = "/specopd/drafter"  # GET: version, swaps, architecture, spec, name (no server paths)
DRAFTER_ADMIN_INFO_PATH = "/specopd/drafter/admin"  # GET (admin): the same plus the checkpoint's server path
PREFIX_CACHE_PATH = "/specopd/prefix_cache"  # GET: stats; POST .../clear (admin): drop every entry
BINARY_CONTENT_TYPE = "application/octet-stream"
# Reply header of score_trees (200, and the 429 of a request that waited): seconds the request waited in the line
QUEUE_WAIT_HEADER = "X-SpecOPD-Queue-Wait-S"
# Request header of score_trees: the admin key, for a request that asks for the target's hidden states or context
# features (admin-only: a model-extraction channel otherwise). A header of its own, because ``Authorization`` must
# carry SGLang's ``--api-key`` on a server that has one (sglang_specopd.server.scoring.auth).
ADMIN_KEY_HEADER = "X-SpecOPD-Admin-Key"
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 2**20
# Per score_trees request, over all its references (HTTP 413 beyond; the server's memory cap,
# score_trees_max_request_mb, usually binds first).
MAX_REQUEST_TOKENS = 262_144  # reference tokens
MAX_REQUEST_NODES = 1_048_576  # tree nodes
MAX_REQUEST_ANCHORS = 262_144  # anchor trees

ReturnKind = Literal["topk", "hidden", "logprobs"]


class AnchorTree(BaseModel):
    """The draft tokens hanging off one anchor: chain ``branches`` or a general tree (``tokens`` + ``parents``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    anchor: int = Field(ge=0)
    branches: Optional[List[List[int]]] = None
    tokens: Optional[List[int]] = None
    parents: Optional[List[int]] = None

    @model_validator(mode="after")
    def _one_form(self) -> "AnchorTree":
        if (self.branches is None) == (self.tokens is None):
            raise ValueError("give either 'branches' or 'tokens' (+ 'parents'), not both or neither")
        if self.tokens is not None and self.parents is not None and len(self.parents) != len(self.tokens):
            raise ValueError(f"'parents' has {len(self.parents)} entries for {len(self.tokens)} tokens")
        return self

    def flat(self) -> Tuple[List[int], List[int]]:
        """(node tokens, node parents within this anchor's tree) for either form."""
        if self.branches is not None:
            tokens, parents = [], []
            for br in self.branches:
                for j, t in enumerate(br):
                    parents.append(-1 if j == 0 else len(tokens) - 1)
                    tokens.append(t)
            return tokens, parents
        if self.parents is not None:
            parents = self.parents
        else:  # a chain; no tokens (a root-only tree): no parents
            parents = [-1] + list(range(len(self.tokens) - 1)) if self.tokens else []
        return list(self.tokens), list(parents)


class ReferenceTrees(BaseModel):
    """One reference sequence and the trees at its anchors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_ids: List[int] = Field(min_length=1)
    trees: List[AnchorTree] = Field(default_factory=list)


class ScoreTreesRequest(BaseModel):
    """``POST /specopd/score_trees``: score every node of every tree with the target in one forward per reference.

    ``returns``: ``topk`` (top-k token ids and log-probs per scored row, plus the row's log-sum-exp of the raw
    logits), ``hidden`` (the target's final normed hidden state per scored row: the trainer applies the LM head
    itself, exact and ~V/H times smaller than full log-probs), ``logprobs`` (full log-probs, large).
    Scored rows per reference: first every anchor row (its prediction is the first draft slot), then every node.
    A tree without nodes (``"tokens": []``) is root-only: it adds its anchor row, a prefix row, and no tree work.
    ``feature_layer_ids``: also return the target context features (SGLang's aux hidden-state capture at those
    layer ids, the DFlash convention) for all reference positions.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    references: List[ReferenceTrees] = Field(min_length=1)
    block_size: int = Field(ge=2, le=64)
    returns: List[ReturnKind] = Field(default_factory=lambda: ["topk"])
    top_k: int = Field(default=20, ge=1, le=1024)
    feature_layer_ids: List[int] = Field(default_factory=list)
    output_dtype: Literal["float32", "bfloat16"] = "float32"



def privileged_parts(req: ScoreTreesRequest) -> List[str]:
    """What of ``req`` needs the admin key (:data:`ADMIN_KEY_HEADER`): ``returns: hidden`` (the target's final
    hidden states) and ``feature_layer_ids`` (its context features); empty for a top-k / log-prob request."""
    return (["returns: hidden"] if "hidden" in req.returns else []) + \
        (["feature_layer_ids"] if req.feature_layer_ids else [])


class ScoreTreesError(ValueError):
    """A score_trees request that is well-formed JSON but invalid for this target (HTTP 400 with the reason)."""


def validate_request(req: ScoreTreesRequest, vocab_size: int, num_layers: int,
                     tick: Optional[Callable[[], None]] = None) -> None:
    """Check everything the server checks before any forward; raise :class:`ScoreTreesError` with the reason.
    ``tick`` (optional) is called once per anchor tree (the server's HTTP side yields the GIL there).

    Token ids in [0, vocab); anchor < len(input_ids); every branch / tree path of length <= block_size - 1;
    parents in [-1, index) (no cycles or forward references); feature layer ids in [0, num_layers - 1),
    strictly increasing.
    """
    for i, ref in enumerate(req.references):
        P = len(ref.input_ids)
        bad = [t for t in ref.input_ids if not 0 <= t < vocab_size]
        if bad:
            raise ScoreTreesError(f"references[{i}].input_ids: token id {bad[0]} outside the vocabulary [0, {vocab_size})")
        for j, tree in enumerate(ref.trees):
            if tick is not None:
                tick()
            where = f"references[{i}].trees[{j}]"
            if tree.anchor >= P:
                raise ScoreTreesError(f"{where}: anchor {tree.anchor} is past the reference end (length {P})")
            if tree.branches is not None:
                for b, br in enumerate(tree.branches):
                    if not br:
                        raise ScoreTreesError(f"{where}.branches[{b}] is empty")
                    if len(br) > req.block_size - 1:
                        raise ScoreTreesError(f"{where}.branches[{b}] has {len(br)} tokens; at most block_size - 1 = "
                                              f"{req.block_size - 1}")
            tokens, parents = tree.flat()  # no tokens: a root-only tree, only its anchor row is scored
            bad = [t for t in tokens if not 0 <= t < vocab_size]
            if bad:
                raise ScoreTreesError(f"{where}: token id {bad[0]} outside the vocabulary [0, {vocab_size})")
            depth: List[int] = []
            for n, p in enumerate(parents):
                if p >= n or p < -1:
                    kind = "a cycle or forward reference" if p >= n else "out of range"
                    raise ScoreTreesError(f"{where}: parents[{n}] = {p} is {kind} (must be -1 or < {n})")
                depth.append(0 if p == -1 else depth[p] + 1)
            if depth and max(depth) + 1 > req.block_size - 1:
                raise ScoreTreesError(f"{where}: a path of {max(depth) + 1} tokens is longer than block_size - 1 = "
                                      f"{req.block_size - 1}")
    for lid in req.feature_layer_ids:
        if not 0 <= lid < num_layers - 1:
            raise ScoreTreesError(f"feature layer id {lid} outside [0, {num_layers - 1}) (the last layer is excluded)")
    ids = req.feature_layer_ids
    if any(b <= a for a, b in zip(ids, ids[1:])):
        # the features come back one block per layer in ascending layer order: an unsorted or repeated list would
        # be answered in another order than asked, so it is refused instead
        raise ScoreTreesError(f"feature_layer_ids must be strictly increasing (sorted, no repeats), got {ids}")


def encode_tensors(tensors: Dict[str, "object"], header: Optional[dict] = None) -> bytes:
    """safetensors bytes of ``tensors`` (contiguous torch tensors) with ``header`` as JSON in the metadata."""
    from safetensors.torch import save

    meta = {"specopd": json.dumps(header or {})}
    return save({k: v.contiguous() for k, v in tensors.items()}, metadata=meta)


def decode_tensors(data: bytes) -> Tuple[Dict[str, "object"], dict]:
    """Inverse of :func:`encode_tensors`: (tensors, header). Raises ``ValueError`` on a malformed payload."""
    from safetensors.torch import load

    try:
        tensors = load(data)
    except Exception as exc:  # safetensors raises its own error types for truncated/garbled input
        raise ValueError(f"malformed safetensors payload: {exc}") from None
    header_len = int.from_bytes(data[:8], "little")
    return tensors, specopd_header(data[8 : 8 + header_len])


def specopd_header(safetensors_header: bytes) -> dict:
    """The specopd header of a payload whose safetensors JSON header is ``safetensors_header`` (already parsed by
    safetensors, which bounds its nesting). Raises ``ValueError`` on a malformed one."""
    from sglang_specopd.wire.strict_json import loads

    try:
        meta = json.loads(safetensors_header).get("__metadata__", {}) or {}
    except (ValueError, AttributeError, RecursionError) as exc:
        raise ValueError(f"malformed safetensors payload: {type(exc).__name__}") from None
    raw = meta.get("specopd", "{}")
    try:  # strict: nesting depth, NaN / Infinity, duplicate keys
        header = loads(raw if isinstance(raw, str) else "", what="the specopd header")
    except ValueError as exc:
        raise ValueError(f"malformed payload: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError(f"malformed payload: the specopd header must be a JSON object, got {type(header).__name__}")
    return header


_INT_DTYPES = ("torch.int32", "torch.int64")


def request_to_binary(req: ScoreTreesRequest) -> bytes:
    """Binary form of a request (tensors per reference, options in the header); the server accepts either."""
    import torch

    tensors = {}
    for i, ref in enumerate(req.references):
        toks, pars, owner = [], [], []
        for j, tree in enumerate(ref.trees):
            t, p = tree.flat()
            toks += t
            pars += p
            owner += [j] * len(t)
        tensors[f"ref{i}.input_ids"] = torch.tensor(ref.input_ids, dtype=torch.int64)
        tensors[f"ref{i}.anchors"] = torch.tensor([t.anchor for t in ref.trees], dtype=torch.int64)
        tensors[f"ref{i}.node_tokens"] = torch.tensor(toks, dtype=torch.int64)
        tensors[f"ref{i}.node_parents"] = torch.tensor(pars, dtype=torch.int64)
        tensors[f"ref{i}.node_anchor"] = torch.tensor(owner, dtype=torch.int64)
    header = req.model_dump(exclude={"references"})
    header["num_references"] = len(req.references)
    return encode_tensors(tensors, header)


def request_from_binary(data: bytes) -> ScoreTreesRequest:
    """Parse the binary form; raises :class:`ScoreTreesError` (wrong dtype, missing tensor) or ``ValueError``."""
    return ScoreTreesRequest.model_validate(request_dict_from_binary(data))


def request_dict_from_binary(data: bytes) -> dict:
    """The binary form as the JSON form's dict (not yet validated by the models; same errors as
    :func:`request_from_binary`)."""
    tensors, header = decode_tensors(data)
    n = header.pop("num_references", None)
    if not isinstance(n, int) or n < 1:
        raise ScoreTreesError("binary payload header needs num_references >= 1")
    refs = []
    for i in range(n):
        parts = {}
        for name in ("input_ids", "anchors", "node_tokens", "node_parents", "node_anchor"):
            key = f"ref{i}.{name}"
            if key not in tensors:
                raise ScoreTreesError(f"binary payload is missing tensor {key!r}")
            t = tensors[key]
            if str(t.dtype) not in _INT_DTYPES or t.dim() != 1:
                raise ScoreTreesError(f"tensor {key!r} must be a 1-D int32/int64 tensor, got {t.dtype} "
                                      f"with shape {tuple(t.shape)}")
            parts[name] = t.tolist()
        if not (len(parts["node_tokens"]) == len(parts["node_parents"]) == len(parts["node_anchor"])):
            raise ScoreTreesError(f"ref{i}: node_tokens, node_parents and node_anchor differ in length")
        n_anchors = len(parts["anchors"])
        bad = [o for o in parts["node_anchor"] if not 0 <= o < n_anchors]
        if bad:
            raise ScoreTreesError(f"ref{i}: node_anchor {bad[0]} does not index an anchor")
        # one pass over the nodes (linear in the request size): bucket each node under its anchor, in order
        tokens: List[List[int]] = [[] for _ in range(n_anchors)]
        parents: List[List[int]] = [[] for _ in range(n_anchors)]
        for tok, par, owner in zip(parts["node_tokens"], parts["node_parents"], parts["node_anchor"]):
            tokens[owner].append(tok)
            parents[owner].append(par)
        trees = [{"anchor": a, "tokens": tokens[j], "parents": parents[j]} for j, a in enumerate(parts["anchors"])]
        refs.append({"input_ids": parts["input_ids"], "trees": trees})
    return {**header, "references": refs}


def tensors_digest(tensors: Dict[str, "object"]) -> str:
    """sha256 over (name, dtype, shape, raw bytes) of every tensor in name order: the swap checksum."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


SWAP_DTYPES = ("float32", "bfloat16", "float16")  # what a serving drafter holds; anything else is refused
SWAP_HEADER_KEYS = ("config", "version", "sha256_of_tensors")
_HEX = frozenset("0123456789abcdefABCDEF")


def check_swap_tensors(tensors: Dict[str, "object"]) -> None:
    """Raise ``ValueError`` naming the first tensor whose dtype is not one of :data:`SWAP_DTYPES` (float8, float64,
    integer, bool, complex ...). Needs nothing but ``dtype``, so it runs before any op on the values (a checksum,
    ``isfinite``) that some dtypes do not implement."""
    for name in sorted(tensors):
        dtype = str(tensors[name].dtype).replace("torch.", "")
        if dtype not in SWAP_DTYPES:
            raise ValueError(f"refused: {name} has dtype {dtype}; a swap takes {', '.join(SWAP_DTYPES)} tensors")


def check_swap_header(header: dict, digest: str) -> str:
    """Validate a binary swap body's header; return its version (``digest[:12]`` when none is given).

    ``header`` may hold only :data:`SWAP_HEADER_KEYS`; ``version``, when present, is a non-empty string;
    ``sha256_of_tensors``, when present, is a 64-digit hex string (an empty string, ``null`` or any other type is
    refused, never taken as "no checksum"). Raises ``ValueError`` with the reason."""
    unknown = sorted(set(header) - set(SWAP_HEADER_KEYS))
    if unknown:
        raise ValueError(f"refused: unknown swap header keys {unknown[:5]} (allowed: {', '.join(SWAP_HEADER_KEYS)})")
    if "sha256_of_tensors" in header:
        want = header["sha256_of_tensors"]
        if not (isinstance(want, str) and len(want) == 64 and set(want) <= _HEX):
            raise ValueError(f"refused: sha256_of_tensors must be a 64-digit hex string, got "
                             f"{type(want).__name__} {_short(want)}")
    return check_swap_version(header, digest[:12])


def check_swap_version(request: dict, default: str) -> str:
    """``request["version"]`` when present (a non-empty string, else ``ValueError``), ``default`` otherwise."""
    if "version" not in request:
        return default
    version = request["version"]
    if not isinstance(version, str) or not version:
        raise ValueError(f"refused: version must be a non-empty string, got {type(version).__name__} "
                         f"{_short(version)}")
    return version


def _short(value: "object", limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def swap_payload(config: dict, tensors: Dict[str, "object"], version: str) -> bytes:
    """The binary body of ``POST /specopd/drafter/swap`` (config + version + checksum in the metadata)."""
    return encode_tensors(tensors, {"config": config, "version": version, "sha256_of_tensors": tensors_digest(tensors)})
