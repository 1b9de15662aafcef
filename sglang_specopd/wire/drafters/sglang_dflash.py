"""How SGLang 0.5.23 reads a DFlash-family drafter config.json, mirrored without importing SGLang.

The truth is the installed SGLang: ``parse_dflash_draft_config`` / ``build_target_layer_ids`` /
``get_dflash_layer_types`` (``srt/speculative/dflash_utils.py``), ``DFlashDraftModel.__init__`` and
``_get_dflash_layer_attention_params`` (``srt/models/dflash.py``), ``parse_dspark_draft_config`` /
``resolve_runtime_config`` (``srt/speculative/dspark_components/dspark_config.py``), ``build_markov_head`` /
``build_confidence_head`` (``srt/models/dspark.py``) and ``DFlashWorkerV2._resolve_mask_token_id``.
``tests/test_published_drafters.py`` runs those functions on the same config files and checks that this module
accepts and refuses the same configs, with the same values.

SGLang reads a *transformers config object*, not the JSON: absent Qwen3 keys take ``Qwen3Config``'s defaults
(:data:`QWEN3_DEFAULTS`; e.g. ``head_dim`` 128, not hidden / heads), ``sliding_window`` is dropped unless
``use_sliding_window``, and absent ``layer_types`` are derived from ``max_window_layers``. :func:`hf_view` builds
that view of a config dict; the parse functions take it.

Every refusal is :class:`SGLangRefusal` (a ``DrafterConfigError`` with code ``sglang_refuses``) whose message is
SGLang's own text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from sglang_specopd.wire.drafters.format import DrafterConfigError

DEFAULT_MASK_TOKEN = "<|MASK|>"  # dflash_utils.DEFAULT_DFLASH_MASK_TOKEN
DEFAULT_BLOCK_SIZE = 16  # resolve_block_size(default=16) and _handle_dflash's fallback
DEFAULT_DSPARK_GAMMA = 7  # dspark_config.DEFAULT_DSPARK_GAMMA
DSPARK_MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
# transformers 5.19 Qwen3Config defaults (tests/test_published_drafters.py compares them with Qwen3Config()).
QWEN3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "attention_bias": False, "use_sliding_window": False, "sliding_window": 4096,
    "max_window_layers": 28, "rope_theta": 10000.0,
}


class SGLangRefusal(DrafterConfigError):
    """A config SGLang 0.5.23 refuses; the one problem's message is SGLang's (code ``sglang_refuses``)."""

    def __init__(self, message: str):
        super().__init__([("sglang_refuses", message)])


def hf_view(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The attribute view SGLang gets from transformers for a ``model_type: qwen3`` drafter config dict: the
    config's keys over :data:`QWEN3_DEFAULTS`, ``num_key_value_heads`` = heads when null, ``sliding_window`` None
    unless ``use_sliding_window``, ``layer_types`` derived when absent, ``rope_theta`` from ``rope_parameters``
    (or the legacy top-level key). Other model types: the config as given (no defaults)."""
    if cfg.get("model_type") != "qwen3":
        return dict(cfg)
    out = {**QWEN3_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None or k not in QWEN3_DEFAULTS}}
    if out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = out["num_attention_heads"]
    if not out["use_sliding_window"]:
        out["sliding_window"] = None
    if out.get("layer_types") is None and isinstance(out["num_hidden_layers"], int):
        out["layer_types"] = ["sliding_attention" if out["sliding_window"] is not None and i >= out["max_window_layers"]
                              else "full_attention" for i in range(out["num_hidden_layers"])]
    rope = cfg.get("rope_parameters")
    if isinstance(rope, Mapping) and rope.get("rope_theta") is not None:
        out["rope_theta"] = rope["rope_theta"]
    return out


def _dict(value: Any) -> dict:
    if value is None:
        return {}
    try:
        return dict(value)
    except (TypeError, ValueError):
        return {}


def _optional_int(value: Any, field_name: str, min_value: Optional[int] = None) -> Optional[int]:
    """SGLang's ``_parse_optional_int``: None stays None; else ``int(value)`` at least ``min_value``."""
    if value is None:
        return None
    try:
        parsed = int(value)
    except (TypeError, ValueError):
        raise SGLangRefusal(f"Invalid {field_name}={value!r}.") from None
    if min_value is not None and parsed < min_value:
        comparator = "positive" if min_value == 1 else f">= {min_value}"
        raise SGLangRefusal(f"{field_name} must be {comparator}, got {parsed}.")
    return parsed


@dataclass(frozen=True)
class DFlashView:
    """What ``parse_dflash_draft_config`` returns (the fields specopd uses); None = absent in the config."""

    num_hidden_layers: Optional[int]
    num_target_layers: Optional[int]
    block_size: Optional[int]
    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    output_multiplier: float
    final_logit_softcapping: Optional[float]
    target_layer_ids: Optional[tuple[int, ...]]
    mask_token: str
    mask_token_id: Optional[int]
    projector_type: Optional[str]


def parse_dflash(view: Mapping[str, Any]) -> DFlashView:
    """Mirror of ``parse_dflash_draft_config`` on an :func:`hf_view` (Domino's extra checks excepted: specopd
    refuses Domino drafters before). Raises SGLangRefusal with SGLang's message."""
    d = _dict(view.get("dflash_config"))
    text = _dict(view.get("text_config")) or view
    layers = _optional_int(text.get("num_hidden_layers"), "DFLASH draft num_hidden_layers", 1)
    n_target = _optional_int(d.get("num_target_layers", view.get("num_target_layers")),
                             "DFLASH draft num_target_layers", 1)
    block = _optional_int(d.get("block_size", view.get("block_size")), "DFLASH block_size", 1)
    taps = _optional_int(d.get("conv_kernel_size", 0), "DFLASH conv_kernel_size", 0)
    group = _optional_int(d.get("conv_group_size", 0), "DFLASH conv_group_size", 0)
    if bool(taps) != bool(group):
        raise SGLangRefusal("DFLASH grouped convolution needs conv_kernel_size and conv_group_size together. "
                            f"Got conv_kernel_size={taps}, conv_group_size={group}.")
    rank = _optional_int(d.get("selector_rank", 0), "DFLASH selector rank", 0)
    top_k = _optional_int(d.get("selector_top_k", 0), "DFLASH selector top_k", 0)
    if bool(rank) != bool(top_k):
        raise SGLangRefusal(f"DFLASH selector needs rank and top_k together. Got rank={rank}, top_k={top_k}.")
    try:
        mult = float(d.get("output_multiplier", 1.0))
        softcap = float(d.get("final_logit_softcapping") or 0.0)
    except (TypeError, ValueError) as exc:
        raise SGLangRefusal(str(exc)) from None
    if mult <= 0:
        raise SGLangRefusal("DFLASH output_multiplier must be positive.")
    ids = d.get("target_layer_ids", view.get("target_layer_ids"))
    if ids is not None:
        if not isinstance(ids, (list, tuple)):
            raise SGLangRefusal("DFLASH dflash_config.target_layer_ids must be a list of ints, "
                                f"got type={type(ids).__name__}.")
        try:
            ids = tuple(int(x) for x in ids)
        except (TypeError, ValueError) as exc:
            raise SGLangRefusal(str(exc)) from None
        if not ids:
            raise SGLangRefusal("DFLASH dflash_config.target_layer_ids must be non-empty. "
                                "Got len(target_layer_ids)=0.")
    token = d.get("mask_token", view.get("mask_token"))
    token = DEFAULT_MASK_TOKEN if token is None else token
    if not isinstance(token, str) or not token:
        raise SGLangRefusal(f"DFLASH dflash_config.mask_token must be a non-empty string, got {token!r}.")
    token_id = d.get("mask_token_id", view.get("mask_token_id"))
    if token_id is not None:
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise SGLangRefusal("DFLASH dflash_config.mask_token_id must be an integer, "
                                f"got {token_id!r} (type={type(token_id).__name__}).")
        if token_id < 0:
            raise SGLangRefusal(f"DFLASH dflash_config.mask_token_id must be non-negative, got {token_id}.")
    return DFlashView(layers, n_target, block, taps, group, rank, top_k, mult, softcap if softcap > 0 else None,
                      ids, token, token_id, d.get("projector_type", view.get("projector_type")))


def model_context_layers(view: Mapping[str, Any], parsed: DFlashView) -> tuple[int, ...]:
    """The target layer ids ``DFlashDraftModel.__init__`` sizes ``fc`` for (K = their count): the config's, else
    ``build_target_layer_ids`` over ``num_target_layers`` (else the draft's own layer count)."""
    if parsed.num_hidden_layers is None:
        raise SGLangRefusal("DFLASH requires draft num_hidden_layers in config. "
                            "Got config without num_hidden_layers.")
    n = parsed.num_target_layers or (max(parsed.target_layer_ids) + 1 if parsed.target_layer_ids
                                     else parsed.num_hidden_layers)
    return resolve_target_layer_ids(parsed, n)


def resolve_target_layer_ids(parsed: DFlashView, target_num_layers: int) -> tuple[int, ...]:
    """Mirror of ``DFlashDraftConfig.resolve_target_layer_ids``: the config's ids (each in 0..N-1), else
    ``build_target_layer_ids(N, num_hidden_layers)``. Raises SGLangRefusal."""
    n = int(target_num_layers)
    if n <= 0:
        raise SGLangRefusal(f"target_num_layers must be positive, got {n}.")
    if parsed.target_layer_ids is None:
        return build_target_layer_ids(n, parsed.num_hidden_layers)
    for idx, val in enumerate(parsed.target_layer_ids):
        if val < 0 or val >= n:
            raise SGLangRefusal("DFLASH target_layer_ids contains an out-of-range layer id. "
                                f"target_layer_ids[{idx}]={val}, target_num_layers={n}.")
    return parsed.target_layer_ids


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """Mirror of SGLang's ``build_target_layer_ids``: ``[N // 2]`` for one draft layer, else
    ``round(1 + i * (N - 4) / (L - 1))`` (ids may repeat when L > N - 3: SGLang does not check). Raises
    SGLangRefusal for N < 4 with L >= 2."""
    n, layers = int(num_target_layers), int(num_draft_layers)
    if layers <= 0:
        raise SGLangRefusal(f"num_draft_layers must be positive, got {layers}.")
    if layers == 1:
        return (n // 2,)
    if n - 3 < 1:
        raise SGLangRefusal(f"DFlash layer selection requires num_target_layers >= 4. Got num_target_layers={n}.")
    return tuple(int(round(1 + i * (n - 4) / (layers - 1))) for i in range(layers))


def layer_attention(view: Mapping[str, Any], num_layers: int) -> tuple[tuple[str, ...], Optional[int]]:
    """``(layer_types, sliding_window)`` of the draft layers as ``_get_dflash_layer_attention_params`` reads
    them (``sliding_window`` in HF's convention, None without sliding layers). Raises SGLangRefusal."""
    text = _dict(view.get("text_config")) or view
    types = text.get("layer_types", view.get("layer_types"))
    if types is None:
        return ("full_attention",) * num_layers, None
    if isinstance(types, str) or not isinstance(types, (list, tuple)):
        raise SGLangRefusal("DFLASH config.layer_types must be a sequence of attention type strings.")
    if len(types) < num_layers:
        raise SGLangRefusal("DFLASH config.layer_types must contain one entry per draft layer. "
                            f"Got {len(types)} entries, layer_id={len(types)}.")
    types = tuple(types[:num_layers])
    for i, kind in enumerate(types):
        if kind not in ("full_attention", "sliding_attention"):
            raise SGLangRefusal(f"Unsupported DFLASH draft layer type. layer_types[{i}]={kind!r}.")
    if "sliding_attention" not in types:
        return types, None
    window = text.get("sliding_window", view.get("sliding_window"))
    if window is None:
        raise SGLangRefusal("DFLASH sliding_attention layers require config.sliding_window.")
    return types, int(window)


def resolve_mask_token_id(token: str, token_id: Optional[int], vocab_size: int, lookup, tokenizer_len: int) -> int:
    """Mirror of ``DFlashWorkerV2._resolve_mask_token_id`` against the target: ``token_id`` if given (below the
    target vocab, and not contradicting the tokenizer's id for ``token``); else the tokenizer's id for ``token``;
    else the id the tokenizer gives it when SGLang adds it (``tokenizer_len``), which must be below the target's
    vocab. ``lookup(token) -> id | None`` reads the target tokenizer. Raises SGLangRefusal."""
    if token_id is not None:
        resolved = int(token_id)
        if resolved >= vocab_size:
            raise SGLangRefusal(_outside_vocab(resolved, vocab_size, token))
        found = lookup(token)
        if found is not None and int(found) != resolved:
            raise SGLangRefusal("DFLASH config mismatch: dflash_config.mask_token_id conflicts with tokenizer vocab "
                                f"id for dflash_config.mask_token. mask_token={token!r}, mask_token_id={resolved}, "
                                f"tokenizer_vocab_id={int(found)}.")
        return resolved
    found = lookup(token)
    resolved = int(found) if found is not None else int(tokenizer_len)
    if resolved >= vocab_size:
        raise SGLangRefusal(_outside_vocab(resolved, vocab_size, token))
    return resolved


def _outside_vocab(token_id: int, vocab_size: int, token: str) -> str:
    return ("DFLASH mask_token_id is outside the target vocab size. "
            f"mask_token_id={token_id}, vocab_size={vocab_size}. "
            f"This likely means mask_token={token!r} requires vocab expansion beyond the model's embedding size. "
            "SGLang does not support resizing target embeddings for DFLASH yet.")


def check_model(view: Mapping[str, Any], parsed: DFlashView, selector: bool) -> None:
    """The refusals of building the draft model (``DFlashGroupedConv``: the conv group divides hidden_size;
    ``DFlash2DraftModel``: a selector rank, when ``selector``). Raises SGLangRefusal."""
    hidden = view.get("hidden_size")
    if parsed.conv_kernel_size and isinstance(hidden, int) and hidden % parsed.conv_group_size:
        raise SGLangRefusal(f"DFLASH conv_group_size={parsed.conv_group_size} must divide hidden_size={hidden}.")
    if selector and not parsed.selector_rank:
        raise SGLangRefusal("DFlash selector draft requires dflash_config.selector_rank.")
