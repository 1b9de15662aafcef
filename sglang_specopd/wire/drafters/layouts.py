"""Published drafter layouts -> specopd's canonical config.json, resolved exactly as SGLang 0.5.23 resolves them.

Drafters come in several layouts, all loaded by SGLang's ``DFlashDraftModel`` / ``DFlash2DraftModel`` /
``DSparkDraftModel``: the DFlash authors' releases (``z-lab/Qwen3-8B-DFlash-b16``: top-level ``block_size``,
``rope_theta``; ``dflash_config`` with only ``mask_token_id`` and ``target_layer_ids``), SpecForge exports (no
``dflash_config`` at all: SGLang's defaults), specopd's own (everything explicit). :func:`canonical_config`
reads any of them through the mirror of SGLang's parsers (:mod:`.sglang_dflash`,
:mod:`.sglang_dspark`) and writes the values SGLang will use into the explicit layout the per-architecture
parsers (:mod:`.format`, :mod:`.dflash2`, :mod:`.dspark`) take: ``dflash_config.{block_size,
target_layer_ids, mask_token, mask_token_id}`` and ``num_target_layers`` filled, the Qwen3 defaults made explicit,
``rope_parameters``, ``layer_types``, DSpark's top-level Markov keys.

What SGLang refuses raises :class:`~.sglang_dflash.SGLangRefusal` (its message); what SGLang serves but
specopd cannot train or swap (Domino, quantized, attention sinks, scaled RoPE, convs on a V1 drafter, ...)
raises ``DrafterConfigError`` with code ``unsupported_by_specopd``; a value SGLang takes from the target
(``mask_token_id``, ``num_target_layers``) without a target given raises code ``needs_target``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from sglang_specopd.wire.drafters.format import DRAFTER_ARCHITECTURE, DrafterConfigError
from sglang_specopd.wire.drafters.sglang_dflash import DEFAULT_BLOCK_SIZE, SGLangRefusal, hf_view, layer_attention
from sglang_specopd.wire.drafters.sglang_dflash import check_model, model_context_layers, parse_dflash
from sglang_specopd.wire.drafters.sglang_dflash import resolve_mask_token_id
from sglang_specopd.wire.drafters.sglang_dflash import resolve_target_layer_ids
from sglang_specopd.wire.drafters.sglang_dspark import PREFIXED_KEYS, check_runtime_mask, parse_dspark, served_gamma

DFLASH2, DSPARK = "DFlash2DraftModel", "DSparkDraftModel"
FAMILY = (DRAFTER_ARCHITECTURE, DFLASH2, DSPARK)
# What SGLang 0.5.23 says for a speculators export (vLLM speculators: architectures ["DFlashSpeculator"], no
# model_type): transformers' AutoConfig cannot read it (tests/test_published_drafters.py runs SGLang's loader).
NO_MODEL_TYPE = "Unrecognized model in {path}. Should have a `model_type` key in its config.json."
_DIMS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
         "intermediate_size", "rms_norm_eps", "vocab_size", "max_position_embeddings")
_V2 = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "output_multiplier",
       "final_logit_softcapping")


@dataclass(frozen=True)
class TargetFacts:
    """What SGLang takes from the target when it resolves a drafter: layer count, LM-head vocabulary (embedding
    rows), ``lookup(token) -> id | None`` over the target tokenizer, and ``tokenizer_len`` (the id the tokenizer
    gives a token SGLang adds to it; None when only the target's config.json is known)."""

    num_hidden_layers: int
    vocab_size: int
    lookup: Callable[[str], Optional[int]]
    tokenizer_len: Optional[int]  # None: no tokenizer here (a config-only target); lookup then answers None


@dataclass(frozen=True)
class Resolution:
    """``config``: the canonical config dict; ``used``: what SGLang will use, key -> ``"value (where from)"``
    (block_size, target_layer_ids, mask_token, mask_token_id, ...); ``notes``: SGLang's warnings for it."""

    config: dict[str, Any]
    used: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def _unsupported(message: str) -> DrafterConfigError:
    return DrafterConfigError([("unsupported_by_specopd", f"{message}: SGLang serves it, but specopd's drafter "
                                                          "(trainer, hot swap) does not implement it")])


def _needs_target(what: str) -> DrafterConfigError:
    return DrafterConfigError([("needs_target", f"config.json has no {what}: SGLang takes it from the target at "
                                                "launch; check the drafter against its target")])


def _check_supported(cfg: Mapping[str, Any], arch: str) -> None:
    d = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), Mapping) else {}
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
    checks = (
        (d.get("projector_type", cfg.get("projector_type")) == "domino", "a Domino projector (projector_type: domino)"),
        (bool(cfg.get("has_embed_tokens")), "a drafter with its own embedding (has_embed_tokens)"),
        (cfg.get("quantization_config") is not None, "a quantized drafter (quantization_config)"),
        (bool(d.get("attention_sink_bias")) or d.get("attention_value_scale") is not None,
         "attention sinks / value scaling (dflash_config.attention_sink_bias / attention_value_scale)"),
        (bool(cfg.get("use_gemma_norm")), "Gemma-style norms (use_gemma_norm)"),
        (bool(cfg.get("attention_bias")), "attention biases (attention_bias: true)"),
        (cfg.get("hidden_act", "silu") != "silu", f"hidden_act {cfg.get('hidden_act')!r} (specopd: silu)"),
        (rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling") is not None
         or float(cfg.get("partial_rotary_factor", 1.0) or 1.0) != 1.0 or cfg.get("rope_is_neox_style") is False,
         "scaled or partial RoPE (rope_type / rope_scaling / partial_rotary_factor / rope_is_neox_style)"),
        (arch != DFLASH2 and bool(d.get("conv_kernel_size")), f"grouped convs on a {arch} drafter "
                                                              "(dflash_config.conv_kernel_size)"),
        (arch == DSPARK and bool(d.get("selector_rank")), "a candidate selector on a DSpark drafter"),
        (arch == DSPARK and any(k in cfg for k in PREFIXED_KEYS), "bundled-head keys (dspark_*)"),
        (isinstance(cfg.get("text_config"), Mapping), "a nested text_config"),
    )
    for bad, what in checks:
        if bad:
            raise _unsupported(what)


def canonical_config(cfg: Any, target: Optional[TargetFacts] = None, path: str = "config.json") -> Resolution:
    """Resolve a DFlash-family config dict as SGLang does (against ``target`` when given) into the canonical
    layout (module docstring). A config that is not a dict, or names another architecture, comes back unchanged
    (the architecture parsers report it). ``path`` names the file in SGLang's messages.

    Raises: SGLangRefusal (SGLang's reason), DrafterConfigError (``unsupported_by_specopd``, ``needs_target``).
    """
    if not isinstance(cfg, Mapping):
        return Resolution(cfg)
    named = cfg.get("architectures") in [[a] for a in FAMILY]
    if "model_type" not in cfg and ("speculators_model_type" in cfg or named):
        raise SGLangRefusal(NO_MODEL_TYPE.format(path=path))
    arch = (cfg.get("architectures") or [None])[0] if isinstance(cfg.get("architectures"), list) else None
    if arch not in FAMILY:
        return Resolution(dict(cfg))
    _check_supported(cfg, arch)
    view = hf_view(cfg)
    ds = parse_dspark(view) if arch == DSPARK else None
    parsed = ds.base if ds is not None else parse_dflash(view)
    model_context_layers(view, parsed)
    check_model(view, parsed, selector=arch == DFLASH2)
    used: dict[str, str] = {}
    notes: list[str] = []
    n = parsed.num_target_layers
    if target is not None:
        if n is not None and n != target.num_hidden_layers:
            notes.append(f"Draft config num_target_layers={n} differs from runtime target num_hidden_layers="
                         f"{target.num_hidden_layers}; selecting capture layers based on the runtime target model.")
        n = target.num_hidden_layers
    elif n is None:
        raise _needs_target("num_target_layers")
    ids = resolve_target_layer_ids(parsed, n)
    if ds is not None:
        token_id = ds.mask_token_id
        if target is not None:
            check_runtime_mask(ds, target.vocab_size)
        block = served_gamma(ds)
        used["gamma"] = f"{block} drafted tokens, verify block {block + 1} ({_where(cfg, 'block_size', 'default 7')})"
        how = _where(cfg, "mask_token_id", "")
    else:
        if target is not None and parsed.mask_token_id is None and target.tokenizer_len is None:
            raise DrafterConfigError([("needs_target", "config.json has no dflash_config.mask_token_id: SGLang "
                                                       "takes it from the target tokenizer at launch (none here)")])
        if target is not None:
            token_id = resolve_mask_token_id(parsed.mask_token, parsed.mask_token_id, target.vocab_size,
                                             target.lookup, target.tokenizer_len or 0)
        elif parsed.mask_token_id is None:
            raise _needs_target("dflash_config.mask_token_id")
        else:
            token_id = parsed.mask_token_id
        block = parsed.block_size if parsed.block_size is not None else DEFAULT_BLOCK_SIZE
        used["block_size"] = f"{block} ({_where(cfg, 'block_size', 'default 16')})"
        how = _where(cfg, "mask_token_id", "")
        if parsed.mask_token_id is None:
            how = ("the target tokenizer's id" if target.lookup(parsed.mask_token) is not None
                   else "added to the target tokenizer by SGLang")
    built = f"built for a {n}-layer target"
    used["target_layer_ids"] = f"{list(ids)} ({_where(cfg, 'target_layer_ids', built)})"
    used["mask_token"] = f"{parsed.mask_token!r} ({_where(cfg, 'mask_token', 'default')})"
    used["mask_token_id"] = f"{token_id} ({how})"
    types, window = layer_attention(view, parsed.num_hidden_layers)
    out = {k: v for k, v in cfg.items() if k not in ("block_size", "target_layer_ids", "mask_token", "mask_token_id",
                                                    "rope_theta", "rope_scaling", "torch_dtype", "dspark_config")}
    out.update({k: view[k] for k in _DIMS if k in view})
    out.update(rope_parameters={"rope_type": "default", "rope_theta": view.get("rope_theta")},
               dtype=str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"), num_target_layers=n,
               layer_types=list(types), use_sliding_window=window is not None, sliding_window=window)
    nested = {k: v for k, v in dict(cfg.get("dflash_config") or {}).items()
              if k not in ("markov_rank", "markov_head_type", "num_target_layers")}
    nested.update(block_size=block, target_layer_ids=list(ids), mask_token=parsed.mask_token, mask_token_id=token_id)
    if arch == DFLASH2:
        nested.update({k: getattr(parsed, k) for k in _V2})
    out["dflash_config"] = nested
    if ds is not None:
        out.update(markov_rank=ds.markov_rank, markov_head_type=ds.markov_head_type, enable_confidence_head=True,
                   confidence_head_with_markov=ds.confidence_head_with_markov, sample_from_anchor=ds.sample_from_anchor)
        used["markov_head"] = f"{ds.markov_head_type} rank {ds.markov_rank} (top-level markov_rank / markov_head_type)"
    if window is not None:
        used["sliding_window"] = f"{window} on layers {[i for i, t in enumerate(types) if t != 'full_attention']}"
    return Resolution(out, used, tuple(notes))


def _where(cfg: Mapping[str, Any], key: str, default: str) -> str:
    d = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), Mapping) else {}
    if key in d:
        return f"dflash_config.{key}"
    if key in cfg:
        return f"top-level {key}"
    return f"SGLang {default}".strip()


def target_facts(target_dir: str) -> TargetFacts:
    """:class:`TargetFacts` of the HF target checkpoint at ``target_dir`` (config.json + tokenizer).

    Raises: TargetConfigError (config), ValueError (no readable tokenizer)."""
    from sglang_specopd.wire.checkpoint_info import read_target_info, read_tokenizer_vocab

    info = read_target_info(target_dir)
    vocab = read_tokenizer_vocab(target_dir)
    return TargetFacts(info.num_hidden_layers, info.vocab_size, vocab.get, max(vocab.values(), default=-1) + 1)
