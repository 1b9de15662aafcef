"""Validated, versioned, all-or-nothing hot swap of the serving drafter's weights (scheduler side).

``POST /specopd/drafter/swap`` (admin key required) carries a safetensors body (checkpoint tensors, metadata
``{"config": <config.json dict>, "version": str}``; streamed to a file, :mod:`.drafter_upload`) or JSON
``{"path": DIR, "version": str}`` naming a drafter directory the server reads. Before anything changes:

* provenance: ``config.architectures`` names the serving drafter's architecture in the registry
  (:mod:`sglang_specopd.wire.drafters.archs`; ``["DFlashDraftModel"]`` for DFlash, ``["DFlash2DraftModel"]`` for
  DFlash V2, ``["DSparkDraftModel"]`` for DSpark: a swap never changes the architecture) and the new config
  describes the SAME drafter (every spec field, e.g. of :class:`~sglang_specopd.wire.drafters.format.DrafterSpec`
  or a DSpark spec's ``markov_rank``, equal to the serving drafter's, dtype and mask token string aside: the config
  may be in any published layout, resolved against the served target as SGLang resolves it);
* names: exactly the serving drafter's checkpoint tensor names (no missing, no extra: a target checkpoint, whose
  layers are called ``model.layers.*``, can never pass, unlike SGLang's own ``update_weights_from_disk``);
* shapes equal, dtypes float32 / bfloat16 / float16 (checked before any op on the values), values finite;
  ``sha256_of_tensors`` (when present: a 64-digit hex string, nothing else) checked; ``version`` (when present) a
  non-empty string. Every refusal is a ``ValueError``: HTTP 400 with the reason.

Then the weights are loaded with the draft model's own ``load_weights`` (fused q/k/v and gate/up handled by
SGLang), whatever the worker derived from the old weights is rebuilt (:func:`rebuild_derived`: the DFLASH worker's
fused context-KV helper, pre-stacked weight copies on GPU; a DSpark draft model's own caches of stacked context-KV
weights, ``_stacked_ctx_kv_cache`` (on by default, CPU included) and the bf16 fused-write bundle
``_fused_kv_write_cache``, rebuilt by SGLang on their next use), and the version is bumped. The draft model is
``worker.draft_model`` on SGLang's DFLASH and DSPARK workers alike (SPECOPD, SPECOPD_DSPARK, DFLASH, DSPARK); the
rollback backup skips the target modules the worker lends the drafter (``lm_head``; DSpark: ``embed_tokens``
too). Any failure while loading restores the previous weights (rollback) and serving goes on. The swap runs
in the scheduler between batches: in-flight requests go on with the new drafter from their next verify step
(outputs stay exact); the radix cache is flushed when the scheduler is idle (reply ``cache_flushed``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Dict, Tuple

import torch

from sglang_specopd.server.drafter import txn as drafter_txn
from sglang_specopd.server.control import op

_STATE = {"version": "initial", "swaps": 0, "spec": None, "target": None}


def current_version() -> str:
    return _STATE["version"]


def _worker(scheduler):
    worker = getattr(scheduler, "draft_worker", None)
    if worker is None or not hasattr(worker, "draft_model"):
        raise ValueError("this server has no drafter to swap (start it with a SPECOPD drafter)")
    return worker


def _target(scheduler):
    """The served target's :class:`~sglang_specopd.wire.drafters.layouts.TargetFacts` (cached), what SGLang resolved
    the serving drafter's config against; None when its config or tokenizer cannot be read here."""
    from sglang_specopd.wire.drafters.layouts import target_facts

    if _STATE["target"] is None:
        try:
            _STATE["target"] = target_facts(scheduler.server_args.model_path)
        except ValueError:  # TargetConfigError included: resolve without the target then
            _STATE["target"] = False
    return _STATE["target"] or None


def _serving_spec(scheduler):
    from sglang_specopd.wire.drafters.archs import load_drafter_spec

    if _STATE["spec"] is None:
        path = scheduler.server_args.speculative_draft_model_path
        _STATE["spec"] = load_drafter_spec(path, target=_target(scheduler))
    return _STATE["spec"]


def _same_drafter(a, b) -> list:
    """Spec fields in which ``b`` differs from ``a``, except the weights' dtype (cast on load) and the mask token's
    string (SGLang serves its id, resolved at launch)."""
    from dataclasses import fields

    return [f.name for f in fields(a) if f.name not in ("dtype", "mask_token")
            and getattr(a, f.name) != getattr(b, f.name)]


def validate_swap(serving_spec, config: dict, tensors: Dict[str, torch.Tensor], target=None) -> None:
    """Raise ``ValueError`` with the first problem if ``(config, tensors)`` is not a drop-in for the serving drafter.

    ``serving_spec`` is a spec of a registered drafter architecture; ``config`` must name the same architecture
    (another registered one, e.g. a DSpark checkpoint on a DFlash server, is refused: "cannot change the drafter
    architecture"), describe the same drafter (dtype and mask token string aside) and come with exactly its
    tensors: same names and shapes, dtypes among float32/bfloat16/float16, finite values. The config may be in any
    published layout: it is resolved as SGLang resolves it, against ``target`` (the served target's
    :class:`~sglang_specopd.wire.drafters.layouts.TargetFacts`) when given."""
    from sglang_specopd.wire.drafters.archs import UnknownDrafterArchError, arch_for_config, arch_for_spec
    from sglang_specopd.wire.drafters.layouts import canonical_config
    from sglang_specopd.wire.protocol import check_swap_tensors

    serving = arch_for_spec(serving_spec)
    if not isinstance(config, dict):
        raise ValueError(f"refused: the drafter config must be a JSON object, got {type(config).__name__}")
    try:
        arch = arch_for_config(config)
    except UnknownDrafterArchError:
        raise ValueError(f"refused: config.architectures is {config.get('architectures')!r}, not "
                         f"[{serving.architecture!r}] of the serving {serving.name} drafter (is this a target "
                         "checkpoint?)") from None
    if arch is not serving:
        raise ValueError(f"refused: config.architectures is {config.get('architectures')!r}, a {arch.name} drafter, "
                         f"but a {serving.name} drafter ([{serving.architecture!r}]) is serving; a swap cannot "
                         "change the drafter architecture (restart the server with the new drafter)")
    try:
        spec = arch.parse_config(canonical_config(config, target).config)
    except ValueError as exc:
        raise ValueError(f"refused: invalid drafter config: {exc}") from None
    diff = _same_drafter(serving_spec, spec)
    if diff:
        raise ValueError(f"refused: the new drafter differs from the serving one in {', '.join(diff)}")
    check_swap_tensors(tensors)
    want = serving.expected_tensors(serving_spec)
    missing = sorted(set(want) - set(tensors))
    extra = sorted(set(tensors) - set(want))
    if missing or extra:
        raise ValueError(f"refused: tensor names differ from the serving drafter (missing {missing[:5]}, "
                         f"unexpected {extra[:5]})")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(want[name]):
            raise ValueError(f"refused: {name} has shape {tuple(t.shape)}, expected {tuple(want[name])}")
        if not torch.isfinite(t).all():
            raise ValueError(f"refused: {name} has non-finite values")


_LENT_MODULES = ("lm_head", "embed_tokens")


def _own_parameters(model, tensor_names=()) -> Dict[str, torch.nn.Parameter]:
    """The draft model's own parameters: without the target modules the worker lends it, unless a swap tensor
    names them. The DFLASH worker assigns ``draft_model.lm_head = <target lm_head>`` before a V2 drafter's first
    selector draft, and the DSPARK worker attaches the target's ``lm_head`` and ``embed_tokens``
    (``attach_shared_modules``), which registers them as submodules; no swap tensor of these drafters names them,
    and backing them up would copy [V, H] matrices."""
    named = {part for name in tensor_names for part in name.split(".")}
    skip = set()
    for attr in _LENT_MODULES:
        lent = getattr(model, attr, None)
        if isinstance(lent, torch.nn.Module) and attr not in named:
            skip |= {id(p) for p in lent.parameters()}
    return {n: p for n, p in model.named_parameters() if id(p) not in skip}


def rebuild_derived(worker) -> None:
    """Rebuild (or drop, to be rebuilt on next use) what the worker derived from the draft model's weights.

    * DFLASH worker: the fused context-KV helper (``_fused_kv_helper``, pre-stacked weight copies; GPU only).
    * DSpark draft model (``DSparkDraftMixin``): ``_stacked_ctx_kv_cache`` (every layer's K/V projection
      concatenated, a copy; built on the first context-KV write when ``SGLANG_DSPARK_STACKED_CTX_KV`` is on, the
      default, CPU included) is reset to its not-built marker ``False``; ``_fused_kv_write_cache`` (the bf16 fused
      writer's concatenated K/V weight for one pool) to ``None``. Without this the context K/V of every later
      request would still be projected with the previous drafter's weights.
    """
    if getattr(worker, "_fused_kv_helper", None) is not None:
        worker._init_fused_kv_helper()
    model = worker.draft_model
    state = vars(model)
    if "_stacked_ctx_kv_cache" in state:
        model._stacked_ctx_kv_cache = False
    if "_fused_kv_write_cache" in state:
        model._fused_kv_write_cache = None


def apply_swap(worker, tensors: Dict[str, torch.Tensor]) -> None:
    """Load ``tensors`` into the serving draft model; on any error restore the previous weights and re-raise."""
    model = worker.draft_model
    params = _own_parameters(model, tensors)
    backup = {n: p.detach().clone() for n, p in params.items()}
    try:
        with torch.no_grad():
            model.load_weights(iter(tensors.items()))
        rebuild_derived(worker)
    except BaseException:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(backup[n])
        rebuild_derived(worker)
        raise


def _read_request(payload: bytes) -> Tuple[dict, Dict[str, torch.Tensor], str]:
    """(config, tensors, version) of a swap body; ``ValueError`` with the reason for anything malformed."""
    from safetensors.torch import load_file

    from sglang_specopd.server.drafter.upload import decode_upload, is_upload
    from sglang_specopd.wire.protocol import (check_swap_header, check_swap_tensors, check_swap_version,
                                              decode_tensors, tensors_digest)

    if payload[:1] == b"{":
        try:
            req = json.loads(payload)
        except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
            raise ValueError(f"refused: the swap body is not valid JSON: {exc}") from None
        if not isinstance(req, dict) or not isinstance(req.get("path"), str):
            raise ValueError('refused: a JSON swap request must be {"path": DIR, "version": str (optional)}')
        unknown = sorted(set(req) - {"path", "version"})
        if unknown:
            raise ValueError(f"refused: unknown keys {unknown[:5]} in a JSON swap request (allowed: path, version)")
        path = Path(req["path"])
        version = check_swap_version(req, path.name)
        try:
            config = json.loads((path / "config.json").read_text())
            tensors = load_file(str(path / "model.safetensors"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"refused: cannot read drafter directory {path}: {exc}") from None
        except Exception as exc:  # safetensors' own errors on truncated files
            raise ValueError(f"refused: cannot read {path / 'model.safetensors'}: {exc}") from None
        check_swap_tensors(tensors)
        return config, tensors, version
    if is_upload(payload):  # a body the HTTP process streamed to a file (sglang_specopd.server.drafter.upload)
        tensors, header, digest = decode_upload(payload)
    else:
        digest, (tensors, header) = hashlib.sha256(payload).hexdigest(), decode_tensors(payload)
    version = check_swap_header(header, digest)
    check_swap_tensors(tensors)  # before the checksum: it reads raw bytes, which some dtypes cannot give
    want = header.get("sha256_of_tensors")
    if want is not None:
        got = tensors_digest(tensors)
        if got != want.lower():
            raise ValueError(f"refused: checksum mismatch (sent {want[:12]}..., received {got[:12]}...)")
    return header.get("config") or {}, tensors, version


def check_swap_request(serving_spec, payload: bytes, target=None) -> Tuple[dict, Dict[str, torch.Tensor], str]:
    """Everything the swap op checks before touching a weight: (config, tensors, version) of a drop-in drafter.

    ``payload``: the HTTP body (safetensors bytes or JSON ``{"path", "version"}``). Raises ``ValueError`` (HTTP
    400) with the first problem: malformed body or header, a checksum that is not a 64-digit hex string or does
    not match, a dtype other than float32/bfloat16/float16, or anything :func:`validate_swap` refuses."""
    config, tensors, version = _read_request(payload)
    validate_swap(serving_spec, config, tensors, target)
    return config, tensors, version


def checked_drafter(scheduler, payload: bytes) -> Tuple[object, Dict[str, torch.Tensor], str]:
    """``(worker, tensors, version)`` of a swap body that is a drop-in for ``scheduler``'s serving drafter
    (:func:`check_swap_request`); ValueError (HTTP 400) with the first problem, also on a server without one."""
    worker = _worker(scheduler)
    _, tensors, version = check_swap_request(_serving_spec(scheduler), payload, _target(scheduler))
    return worker, tensors, version


def serving_worker(scheduler):
    """The speculative worker whose ``draft_model`` serves; ValueError (HTTP 400) on a server without a drafter."""
    return _worker(scheduler)


def install(scheduler, worker, tensors: Dict[str, torch.Tensor], version: str) -> dict:
    """Make validated ``tensors`` the serving drafter under ``version`` (:func:`apply_swap`, version bump, radix
    cache flush when idle); ``{"version", "previous_version", "swaps", "cache_flushed"}``. Shared by the one-phase
    swap and a rollout commit (:mod:`sglang_specopd.server.drafter.rollout`)."""
    apply_swap(worker, tensors)
    previous = _STATE["version"]
    _STATE["version"], _STATE["swaps"] = version, _STATE["swaps"] + 1
    # The radix cache keeps the draft KV (context projections) the previous drafter computed for cached prefixes;
    # new requests would reuse it. Drop it when nothing is running (SGLang refuses to flush a busy scheduler).
    flushed = bool(scheduler.flush_cache()) if hasattr(scheduler, "flush_cache") else False
    return {"version": version, "previous_version": previous, "swaps": _STATE["swaps"], "cache_flushed": flushed}


@op("swap_drafter")
def swap_drafter_op(scheduler, payload: bytes):
    """Scheduler op: validate then apply a drafter swap; reply JSON {version, previous_version, swaps,
    cache_flushed}. 409 (:class:`~sglang_specopd.server.drafter.txn.TxnConflict`) while a rollout transaction is
    staged: the swap would change the drafter under it."""
    drafter_txn.check_free()
    worker, tensors, version = checked_drafter(scheduler, payload)
    reply = install(scheduler, worker, tensors, version)
    drafter_txn.clear_last_commit()
    return 200, "ok", json.dumps(reply).encode()


@op("drafter_info")
def drafter_info_op(scheduler, payload: bytes):
    """Scheduler op: the serving drafter's version, swap count, path, spec, the staged rollout transaction
    (``staged``: ``{"txn", "version", "expires_in_s"}`` or null) and the served target's identity (``target``:
    :func:`~sglang_specopd.server.target_identity.target_identity`)."""
    from sglang_specopd.server.target_identity import target_identity
    from sglang_specopd.wire.drafters.archs import arch_for_spec, spec_as_dict

    worker = getattr(scheduler, "draft_worker", None)
    staged = drafter_txn.current()
    info = {"version": _STATE["version"], "swaps": _STATE["swaps"], "has_drafter": worker is not None,
            "staged": staged.info() if staged is not None else None, "target": target_identity(scheduler)}
    if worker is not None and hasattr(worker, "draft_model"):
        info["path"] = scheduler.server_args.speculative_draft_model_path
        spec = _serving_spec(scheduler)
        info["arch"] = arch_for_spec(spec).name
        info["spec"] = spec_as_dict(spec)
    return 200, "ok", json.dumps(info).encode()
