"""The DFlash drafter checkpoint format that SGLang 0.5.23 loads (``--speculative-algorithm DFLASH``).

Pure and import-light (json/struct only): shared by ``specopd drafter``, the trainer and the server hot-swap.
Verified against ``sglang/srt/models/dflash.py`` (``DFlashDraftModel``) and
``sglang/srt/speculative/dflash_utils.py`` (``parse_dflash_draft_config``):

* config.json: ``architectures: ["DFlashDraftModel"]`` selects the model class; ``model_type: "qwen3"`` makes
  ``AutoConfig`` (SGLang's HF config parser) accept it; the Qwen3 fields the draft layers read (hidden_size,
  num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size, hidden_act,
  rms_norm_eps, rope_parameters, max_position_embeddings, vocab_size); ``layer_types`` all ``"full_attention"``
  (no ``is_causal`` key): SGLang then builds ENCODER_ONLY (non-causal) draft attention, as DFlash needs;
  top-level ``num_target_layers``; ``dflash_config: {block_size, target_layer_ids, mask_token, mask_token_id}``.
* weights (no bias anywhere; embedding and LM head come from the target): ``layers.{i}.input_layernorm``,
  ``self_attn.{q,k,v,o}_proj`` (SGLang's ``load_weights`` stacks q/k/v into ``qkv_proj``), ``self_attn.{q,k}_norm``
  [head_dim], ``post_attention_layernorm``, ``mlp.{gate,up,down}_proj`` (gate/up stacked into ``gate_up_proj``),
  ``fc.weight`` [H, K*H] with K = len(target_layer_ids), ``hidden_norm.weight``, ``norm.weight``. SGLang silently
  ignores names it does not know, so a stray tensor is a bug only our checker reports.
* ``target_layer_ids`` are 0-based target layers whose outputs feed ``fc``; SGLang captures them before layer
  id+1, so the target's last layer can never be used.

This is specopd's canonical (explicit) layout: every key above present. Drafters in other published layouts (the
DFlash authors' releases, SpecForge exports: keys left to SGLang's defaults, ``block_size`` at the top level) are
first resolved into it exactly as SGLang resolves them (:mod:`sglang_specopd.wire.drafters.layouts`, through the
registry's :func:`~sglang_specopd.wire.drafters.archs.parse_drafter_config`); :func:`spec_from_config` itself reads
the canonical layout only. Optional canonical keys: ``layer_types`` with ``sliding_attention`` entries plus
``sliding_window``, and ``is_causal`` (SGLang serves them; specopd's trainer refuses them).

This module is the DFlash entry's format; :mod:`sglang_specopd.wire.drafters.archs` is the registry of drafter
architectures (DFlash, DFlash V2 in :mod:`.dflash2`, DSpark in :mod:`.dspark`) that the trainer,
the server and the CLI go through.
``init_drafter``/``choose_mask_token``/``save_drafter`` live in :mod:`sglang_specopd.wire.drafters.init` (also
reachable from this module by lazy re-export); ``check_drafter`` lives in :mod:`sglang_specopd.app.drafters.check`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

DRAFTER_ARCHITECTURE = "DFlashDraftModel"
DRAFTER_MODEL_TYPE = "qwen3"
LAYER_TYPES = ("full_attention", "sliding_attention")  # what SGLang's DFlash draft layers take
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}  # our dtype name -> safetensors dtype tag
_LAZY = {name: "sglang_specopd.wire.drafters.init" for name in (
    "init_drafter", "choose_mask_token", "save_drafter", "init_drafter_tensors", "MaskTokenError")}


class DrafterFormatError(ValueError):
    """Base error of the drafter format. ``problems`` holds ``(code, message)`` pairs, one per defect."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = list(problems)
        super().__init__("; ".join(msg for _, msg in self.problems))


class DrafterSpecError(DrafterFormatError):
    """A DrafterSpec with invalid values (non-positive sizes, bad target_layer_ids, block_size < 2, ...)."""


class DrafterConfigError(DrafterFormatError):
    """A drafter config.json (or dict) that is malformed, misses keys or holds invalid values."""


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Target layers whose hidden states feed the drafter: ``round(1 + i*(N-4)/(L-1))`` for i in 0..L-1.

    Same values as SGLang's ``build_target_layer_ids`` (Python ``round``, i.e. half-to-even), spread over target
    layers 1..N-3. L = 1 gives ``[N // 2]`` (SGLang's choice: one middle layer, the upper middle for even N).
    The result is strictly increasing and never contains the last layer N-1.

    Raises:
        DrafterSpecError: L < 1; N < 3 (L = 1) or N < 4 (L >= 2); L > N-3 for L >= 2 (ids would repeat).
    """
    n, count = int(num_target_layers), int(num_draft_layers)
    if count < 1:
        raise DrafterSpecError([("layer_ids", f"number of context layers must be >= 1, got {count}")])
    if count == 1:
        if n < 3:
            raise DrafterSpecError([("layer_ids", f"a single context layer needs a target with >= 3 layers, got {n}")])
        return [n // 2]
    if n < 4 or count > n - 3:
        raise DrafterSpecError([(
            "layer_ids",
            f"cannot spread {count} distinct context layers over target layers 1..{n - 3} of a {n}-layer target; "
            "use fewer context layers or pass target_layer_ids explicitly",
        )])
    return [int(round(1 + i * (n - 4) / (count - 1))) for i in range(count)]


def layer_id_problems(ids: Any, num_target_layers: int) -> list[tuple[str, str]]:
    """Problems of ``target_layer_ids`` for an N-layer target: empty/non-int, out of range, the last layer
    (N-1), duplicates, not increasing. Returns ``(code, message)`` pairs; empty when valid."""
    n = int(num_target_layers)
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                                for i in ids):
        return [("layer_ids_invalid", f"target_layer_ids must be a non-empty list of ints, got {ids!r}")]
    out: list[tuple[str, str]] = []
    for i in ids:
        if i < 0 or i >= n:
            out.append(("layer_id_out_of_range", f"target_layer_ids contains {i}: out of range 0..{n - 1} "
                                                 f"for a {n}-layer target"))
        elif i == n - 1:
            out.append(("layer_id_is_last", f"target_layer_ids contains {i}, the target's last layer; SGLang "
                                            f"captures before layer id+1, so ids must be <= {n - 2}"))
    if len(set(ids)) != len(ids):
        out.append(("layer_ids_duplicate", f"target_layer_ids has duplicates: {list(ids)}"))
    elif list(ids) != sorted(ids):
        out.append(("layer_ids_unsorted", f"target_layer_ids must be increasing, got {list(ids)}"))
    return out


@dataclass(frozen=True)
class DrafterSpec:
    """Everything that fixes a DFlash drafter's config.json and tensor shapes. Validated on construction
    (raises DrafterSpecError listing every invalid field). ``dtype`` is one of float32, bfloat16, float16."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    max_position_embeddings: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token: str
    mask_token_id: int
    num_target_layers: int
    dtype: str = "float32"
    layer_types: tuple[str, ...] = ()
    sliding_window: Optional[int] = None
    is_causal: Optional[bool] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        object.__setattr__(self, "layer_types", tuple(self.layer_types or ()))
        problems: list[tuple[str, str]] = []
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "vocab_size", "max_position_embeddings", "num_target_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(("invalid_value", f"{name} must be a positive int, got {value!r}"))
        if problems:
            raise DrafterSpecError(problems)
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(("invalid_value", f"num_key_value_heads={self.num_key_value_heads} must divide "
                                              f"num_attention_heads={self.num_attention_heads}"))
        if not (isinstance(self.block_size, int) and self.block_size >= 2):
            problems.append(("block_size_too_small", f"block_size must be an int >= 2, got {self.block_size!r}"))
        if not (isinstance(self.rms_norm_eps, (int, float)) and self.rms_norm_eps > 0 and self.rope_theta > 0):
            problems.append(("invalid_value", f"rms_norm_eps and rope_theta must be > 0, got "
                                              f"{self.rms_norm_eps!r}, {self.rope_theta!r}"))
        if not isinstance(self.mask_token, str) or not self.mask_token:
            problems.append(("invalid_value", f"mask_token must be a non-empty string, got {self.mask_token!r}"))
        if not isinstance(self.mask_token_id, int) or not 0 <= self.mask_token_id < self.vocab_size:
            problems.append(("mask_token_out_of_vocab", f"mask_token_id {self.mask_token_id!r} is outside the "
                                                        f"vocabulary 0..{self.vocab_size - 1}"))
        if self.dtype not in DTYPES:
            problems.append(("invalid_value", f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"))
        problems += layer_id_problems(list(self.target_layer_ids), self.num_target_layers)
        problems += self._attention_problems()
        problems += self._extra_problems()
        if problems:
            raise DrafterSpecError(problems)

    def _attention_problems(self) -> list[tuple[str, str]]:
        types, window = self.layer_types, self.sliding_window
        out: list[tuple[str, str]] = []
        if types and (len(types) != self.num_hidden_layers or not set(types) <= set(LAYER_TYPES)
                      or "sliding_attention" not in types):
            out.append(("invalid_value", f"layer_types must be empty (all full attention) or one of {LAYER_TYPES} per "
                                         f"draft layer with a sliding layer among them, got {list(types)}"))
        if ("sliding_attention" in types) != (window is not None) or (
                window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1)):
            out.append(("invalid_value", f"sliding_window must be a positive int exactly when a layer is "
                                         f"sliding_attention, got {window!r}"))
        if self.is_causal not in (None, True, False):
            out.append(("invalid_value", f"is_causal must be true, false or absent, got {self.is_causal!r}"))
        return out

    @property
    def plain_attention(self) -> bool:
        """Whether every draft layer is SGLang's default DFlash attention (full, non-causal inside the block): the
        only kind specopd's trainer and tree scoring implement."""
        return not self.layer_types and self.is_causal is not True

    def _extra_problems(self) -> list[tuple[str, str]]:
        """Problems of a subclass's own fields (DFlash V2, DSpark), reported with the DFlash ones; none here."""
        return []

    @property
    def num_context_features(self) -> int:
        """K = len(target_layer_ids): ``fc`` maps [K*hidden_size] -> [hidden_size]."""
        return len(self.target_layer_ids)


def expected_tensors(spec: DrafterSpec) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names -> shapes SGLang's ``DFlashDraftModel`` loads for ``spec`` (no biases, no
    embedding, no LM head). Order: layers by index, then fc, hidden_norm, norm."""
    h, hd, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    q, kv = spec.num_attention_heads * hd, spec.num_key_value_heads * hd
    out: dict[str, tuple[int, ...]] = {}
    for i in range(spec.num_hidden_layers):
        p = f"layers.{i}."
        out.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
    out["fc.weight"] = (h, spec.num_context_features * h)
    out["hidden_norm.weight"] = (h,)
    out["norm.weight"] = (h,)
    return out


def drafter_config(spec: DrafterSpec) -> dict[str, Any]:
    """The config.json dict for ``spec`` (see the module docstring for why each key is there)."""
    return {
        "architectures": [DRAFTER_ARCHITECTURE],
        "model_type": DRAFTER_MODEL_TYPE,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "max_position_embeddings": spec.max_position_embeddings,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": False,
        "layer_types": list(spec.layer_types) or ["full_attention"] * spec.num_hidden_layers,
        "use_sliding_window": spec.sliding_window is not None,
        **({} if spec.sliding_window is None else {"sliding_window": spec.sliding_window}),
        "num_target_layers": spec.num_target_layers,
        "dflash_config": {
            "block_size": spec.block_size,
            "target_layer_ids": list(spec.target_layer_ids),
            "mask_token": spec.mask_token,
            "mask_token_id": spec.mask_token_id,
        },
        "dtype": spec.dtype,
        **({} if spec.is_causal is None else {"is_causal": spec.is_causal}),
    }


def write_config_json(cfg: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> Path:
    """Atomically write the dict ``cfg`` to ``out_dir/config.json`` (dir created, 2-space indent); return the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".config.", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(dict(cfg), fh, indent=2)
        fh.write("\n")
    os.replace(tmp, out / "config.json")
    return out / "config.json"


def write_drafter_config(spec: DrafterSpec, out_dir: str | os.PathLike[str]) -> Path:
    """Atomically write ``drafter_config(spec)`` to ``out_dir/config.json`` (dir created); return the path."""
    return write_config_json(drafter_config(spec), out_dir)


def dflash_fields(cfg: Any, architecture: str = DRAFTER_ARCHITECTURE) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The DrafterSpec fields of a DFlash-family config.json dict, and its problems (DFlash, DFlash V2 and DSpark
    share them: Qwen3 dims, ``rope_parameters.rope_theta``, ``num_target_layers``, ``dtype`` and
    ``dflash_config.{block_size, target_layer_ids, mask_token, mask_token_id}``).

    Returns ``(values, problems)``: ``values`` maps DrafterSpec field names to the raw config values found;
    ``problems`` lists ``(code, message)`` for a non-dict config, ``architectures != [architecture]`` and every
    missing key. Values are not validated here (DrafterSpec does that)."""
    if not isinstance(cfg, Mapping):
        return {}, [("config_malformed", f"config.json must hold a JSON object, got {type(cfg).__name__}")]
    problems: list[tuple[str, str]] = []
    if cfg.get("architectures") != [architecture]:
        problems.append(("config_invalid", f"architectures must be [{architecture!r}], "
                                           f"got {cfg.get('architectures')!r}"))
    dflash = cfg.get("dflash_config")
    if not isinstance(dflash, Mapping):
        problems.append(("config_key_missing", "config.json is missing key dflash_config (an object)"))
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
    values: dict[str, Any] = {}
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "intermediate_size", "rms_norm_eps", "vocab_size", "max_position_embeddings", "num_target_layers",
                 "dtype"):
        if name in cfg:
            values[name] = cfg[name]
        else:
            problems.append(("config_key_missing", f"config.json is missing key {name}"))
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        problems.append(("config_key_missing", "config.json is missing key rope_parameters.rope_theta"))
    values["rope_theta"] = theta
    types = cfg.get("layer_types")
    if isinstance(types, list) and types != ["full_attention"] * len(types):
        values["layer_types"] = tuple(types)
        values["sliding_window"] = cfg.get("sliding_window")
    values["is_causal"] = cfg.get("is_causal")
    for name in ("block_size", "target_layer_ids", "mask_token", "mask_token_id"):
        if not isinstance(dflash, Mapping):
            break
        if name in dflash:
            values[name] = dflash[name]
        else:
            problems.append(("config_key_missing", f"config.json is missing key dflash_config.{name}"))
    return values, problems


def build_spec(spec_type: type, values: Mapping[str, Any], problems: list[tuple[str, str]] = ()) -> Any:
    """``spec_type(**values)`` (a DrafterSpec or a subclass), turning every defect into one DrafterConfigError.

    Raises DrafterConfigError listing ``problems`` (if any), or the spec's own validation problems, or a
    wrong-type value."""
    if problems:
        raise DrafterConfigError(list(problems))
    try:
        return spec_type(**values)
    except DrafterSpecError as exc:
        raise DrafterConfigError(exc.problems) from None
    except TypeError as exc:  # e.g. rope_theta of a non-numeric type compared with 0
        raise DrafterConfigError([("config_invalid", f"config.json has a value of the wrong type: {exc}")]) from None


def spec_from_config(cfg: Mapping[str, Any]) -> DrafterSpec:
    """Parse a drafter config.json dict (as written by :func:`drafter_config`) into a DrafterSpec.

    Raises:
        DrafterConfigError: not a dict, wrong ``architectures``, missing keys (all listed), or invalid values.
    """
    values, problems = dflash_fields(cfg)
    return build_spec(DrafterSpec, values, problems)


def read_drafter_config(drafter_dir: str | os.PathLike[str]) -> Any:
    """The parsed JSON of ``drafter_dir/config.json`` (any JSON value; callers check it is an object).

    Raises:
        DrafterConfigError: ``config_missing`` (no such file) or ``config_malformed`` (unreadable, not JSON).
    """
    path = Path(drafter_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DrafterConfigError([("config_missing", f"{path} does not exist")]) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DrafterConfigError([("config_malformed", f"{path} is not valid JSON: {exc}")]) from None


def read_drafter_spec(drafter_dir: str | os.PathLike[str]) -> DrafterSpec:
    """Read a DFlash ``drafter_dir/config.json`` into a DrafterSpec (any architecture:
    :func:`sglang_specopd.wire.drafters.archs.load_drafter_spec`). Raises DrafterConfigError (missing/malformed/
    invalid, or not ``DFlashDraftModel``)."""
    return spec_from_config(read_drafter_config(drafter_dir))


def __getattr__(name: str) -> Any:  # PEP 562 lazy re-exports (avoid import cycles)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
