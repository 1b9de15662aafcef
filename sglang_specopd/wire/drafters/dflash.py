"""The DFlash entry's hooks for :mod:`sglang_specopd.wire.drafters.archs` (its format: :mod:`.format`).

Target facts read from a raw config.json, the one-line summary, and the fresh spec ``specopd drafter init`` builds
for a target. Pure (no torch, no tokenizer: the mask token comes from the request's resolver).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from sglang_specopd.wire.drafters.format import DrafterSpec, DrafterSpecError, default_target_layer_ids


def target_facts(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Facts of a (possibly invalid) DFlash config.json checked against the target: top-level hidden_size,
    vocab_size, num_target_layers and ``dflash_config``'s target_layer_ids, mask_token, mask_token_id (those
    present)."""
    out = {k: cfg[k] for k in ("hidden_size", "vocab_size", "num_target_layers") if k in cfg}
    dflash = cfg.get("dflash_config")
    if isinstance(dflash, Mapping):
        out.update({k: dflash[k] for k in ("target_layer_ids", "mask_token", "mask_token_id") if k in dflash})
    return out


def describe(spec: DrafterSpec) -> str:
    """``"2 layers x hidden 64 (4/2 heads), block_size 8, target_layer_ids [1, 3] of 6, mask '<m>' (id 4),
    float32"``."""
    attention = ""
    if spec.layer_types:
        attention += (f", sliding window {spec.sliding_window} on {spec.layer_types.count('sliding_attention')} "
                      "layers")
    if spec.is_causal is not None:
        attention += ", causal" if spec.is_causal else ", non-causal"
    return (f"{spec.num_hidden_layers} layers x hidden {spec.hidden_size} ({spec.num_attention_heads}/"
            f"{spec.num_key_value_heads} heads), block_size {spec.block_size}, target_layer_ids "
            f"{list(spec.target_layer_ids)} of {spec.num_target_layers}, mask {spec.mask_token!r} "
            f"(id {spec.mask_token_id}){attention}, {spec.dtype}")


def spec_for_target(req: Any) -> DrafterSpec:
    """:func:`base_spec_for_target`; DFlash takes no ``req.options`` (raises DrafterSpecError for any)."""
    parse_options(getattr(req, "options", {}) or {}, {})
    return base_spec_for_target(req)


def base_spec_for_target(req: Any) -> DrafterSpec:
    """A DFlash spec for ``req`` (a :class:`~sglang_specopd.wire.drafters.archs.DrafterInitRequest`), ignoring
    ``req.options`` (the DFlash V2 and DSpark entries start from it).

    Dims (hidden, heads, kv heads, head_dim, intermediate, rms eps, rope theta, vocab, max positions) copy the
    target's. Context layers: ``req.target_layer_ids`` if given, else ``default_target_layer_ids(N, K)`` with
    K = ``req.num_context_layers`` or ``min(num_layers, max(1, N - 3))``. Mask token: ``req.resolve_mask_token()``.

    Raises: DrafterSpecError (invalid sizes/ids/block_size), MaskTokenError (from the resolver).
    """
    info = req.target
    ids = req.target_layer_ids
    if ids is None:
        k = req.num_context_layers or min(int(req.num_layers), max(1, info.num_hidden_layers - 3))
        ids = default_target_layer_ids(info.num_hidden_layers, k)
    token, token_id = req.resolve_mask_token()
    return DrafterSpec(
        hidden_size=info.hidden_size, num_hidden_layers=int(req.num_layers),
        num_attention_heads=info.num_attention_heads, num_key_value_heads=info.num_key_value_heads,
        head_dim=info.head_dim, intermediate_size=info.intermediate_size, rms_norm_eps=info.rms_norm_eps,
        rope_theta=info.rope_theta, vocab_size=info.vocab_size, max_position_embeddings=info.max_position_embeddings,
        block_size=int(req.block_size), target_layer_ids=tuple(int(i) for i in ids), mask_token=token,
        mask_token_id=token_id, num_target_layers=info.num_hidden_layers, dtype=req.dtype,
    )


def parse_options(options: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` overridden by ``options`` (``specopd drafter init --option KEY=VALUE``). String values are read
    as JSON scalars (``8``, ``0.5``), ``true``/``false`` and ``none``/``null`` (None); other strings stay strings.

    Raises DrafterSpecError (code ``invalid_option``) for a key not in ``defaults``."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise DrafterSpecError([("invalid_option", f"unknown option(s) {', '.join(unknown)}; this architecture "
                                                   f"takes {', '.join(sorted(defaults))}")])
    out = dict(defaults)
    for key, value in options.items():
        if isinstance(value, str):
            low = value.strip().lower()
            if low in ("none", "null"):
                value = None
            elif low in ("true", "false"):
                value = low == "true"
            else:
                try:
                    value = json.loads(value)
                except ValueError:
                    pass
        out[key] = value
    return out
