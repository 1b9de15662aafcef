"""The DFlash V2 drafter checkpoint format SGLang 0.5.23 loads (``DFlash2DraftModel``, served by the DFLASH worker).

Verified against ``sglang/srt/models/dflash.py`` (``DFlash2DraftModel``, ``DFlashGroupedConv``,
``CandidateSelector``) and ``sglang/srt/speculative/dflash_utils.py`` (``parse_dflash_draft_config``). SGLang picks
the class from ``architectures: ["DFlash2DraftModel"]`` and serves it with ``--speculative-algorithm DFLASH``
(``dflash_worker_v2.py`` ``_SelectorDraftSampler`` / ``_propose_selector_block``).

* config.json: the DFlash config (:func:`sglang_specopd.wire.drafters.format.drafter_config`) plus, in
  ``dflash_config``: ``conv_kernel_size`` (taps of the grouped dynamic depthwise conv around each attention and
  MLP sublayer; 0 = no conv), ``conv_group_size`` (channels per group; divides hidden_size; 0 iff no conv),
  ``selector_rank`` r and ``selector_top_k`` K of the candidate selector (both > 0: ``DFlash2DraftModel``
  refuses a rank of 0), ``output_multiplier`` (> 0) and ``final_logit_softcapping`` (null = none) applied to the
  top-K head logits.
* tensors: the DFlash ones, plus per layer ``layers.{i}.{attention,mlp}_conv.base_kernel [2, taps, H]``
  (``[input/output side, tap, channel]``) and ``.kernel_projection.weight [2*taps*H/group, H]`` when the conv is
  on, and ``candidate_selector.{predecessor,successor}_codebook [V, r]``,
  ``candidate_selector.hidden_projection.weight [r, H]``.
* init (:func:`init_rules`): conv ``base_kernel`` is the identity (tap 0 = 1, other taps 0) and
  ``kernel_projection`` zero, so a fresh conv is exactly the identity; the successor codebook is zero, so a fresh
  selector scores every candidate by its head logit alone (a fresh V2 drafter proposes what a DFlash drafter
  with the same backbone weights proposes); the predecessor codebook and hidden projection are N(0, 0.02).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from sglang_specopd.wire.drafters import dflash as _dflash
from sglang_specopd.wire.drafters.format import DrafterSpec, build_spec, dflash_fields, drafter_config
from sglang_specopd.wire.drafters.format import expected_tensors as dflash_tensors

DFLASH2_ARCHITECTURE = "DFlash2DraftModel"
V2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "output_multiplier",
           "final_logit_softcapping")
DEFAULTS = {"conv_kernel_size": 2, "selector_rank": 32, "selector_top_k": 8, "output_multiplier": 1.0,
            "final_logit_softcapping": None}  # conv_group_size defaults to head_dim (spec_for_target)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class DFlash2Spec(DrafterSpec):
    """A DFlash V2 drafter: a :class:`DrafterSpec` plus the conv and candidate-selector fields (module docstring).
    Validated on construction (raises DrafterSpecError listing every invalid field, the DFlash ones included)."""

    conv_kernel_size: int = 2
    conv_group_size: int = 64
    selector_rank: int = 32
    selector_top_k: int = 8
    output_multiplier: float = 1.0
    final_logit_softcapping: Optional[float] = None

    def _extra_problems(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        taps, group = self.conv_kernel_size, self.conv_group_size
        if not (_is_int(taps) and taps >= 0 and _is_int(group) and group >= 0):
            problems.append(("invalid_value", f"conv_kernel_size and conv_group_size must be ints >= 0, got "
                                              f"{taps!r}, {group!r}"))
        elif bool(taps) != bool(group):
            problems.append(("invalid_value", f"conv_kernel_size and conv_group_size are 0 together (no conv) or "
                                              f"positive together, got {taps}, {group}"))
        elif group and _is_int(self.hidden_size) and self.hidden_size % group:
            problems.append(("invalid_value", f"conv_group_size {group} must divide hidden_size "
                                              f"{self.hidden_size}"))
        rank, top_k = self.selector_rank, self.selector_top_k
        if not (_is_int(rank) and rank >= 1 and _is_int(top_k) and top_k >= 1):
            problems.append(("invalid_value", f"selector_rank and selector_top_k must be ints >= 1 "
                                              f"(DFlash2DraftModel needs a selector), got {rank!r}, {top_k!r}"))
        elif _is_int(self.vocab_size) and top_k > self.vocab_size:
            problems.append(("invalid_value", f"selector_top_k {top_k} exceeds vocab_size {self.vocab_size}"))
        mult, cap = self.output_multiplier, self.final_logit_softcapping
        if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not mult > 0:
            problems.append(("invalid_value", f"output_multiplier must be a number > 0, got {mult!r}"))
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
            problems.append(("invalid_value", f"final_logit_softcapping must be null or a number > 0, got {cap!r}"))
        return problems

    @property
    def has_conv(self) -> bool:
        """Whether the layers carry the grouped conv (``conv_kernel_size > 0``)."""
        return self.conv_kernel_size > 0


def expected_tensors(spec: DFlash2Spec) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names -> shapes ``DFlash2DraftModel`` loads for ``spec``: the DFlash tensors, each layer's
    conv tensors after its MLP (when on), then the selector."""
    base = dflash_tensors(spec)
    h, taps = spec.hidden_size, spec.conv_kernel_size
    out: dict[str, tuple[int, ...]] = {}
    for i in range(spec.num_hidden_layers):
        p = f"layers.{i}."
        out.update({n: s for n, s in base.items() if n.startswith(p)})
        if spec.has_conv:
            for side in ("attention_conv", "mlp_conv"):
                out[f"{p}{side}.base_kernel"] = (2, taps, h)
                out[f"{p}{side}.kernel_projection.weight"] = (2 * taps * (h // spec.conv_group_size), h)
    out.update({n: s for n, s in base.items() if not n.startswith("layers.")})
    out["candidate_selector.predecessor_codebook"] = (spec.vocab_size, spec.selector_rank)
    out["candidate_selector.successor_codebook"] = (spec.vocab_size, spec.selector_rank)
    out["candidate_selector.hidden_projection.weight"] = (spec.selector_rank, h)
    return out


def config(spec: DFlash2Spec) -> dict[str, Any]:
    """The config.json dict of ``spec``: the DFlash config with ``architectures: ["DFlash2DraftModel"]`` and the
    V2 keys in ``dflash_config``."""
    cfg = drafter_config(spec)
    cfg["architectures"] = [DFLASH2_ARCHITECTURE]
    cfg["dflash_config"].update({k: getattr(spec, k) for k in V2_KEYS})
    return cfg


def parse_config(cfg: Mapping[str, Any]) -> DFlash2Spec:
    """Parse a DFlash V2 config.json dict. Missing V2 keys take SGLang's defaults (no conv, output_multiplier 1,
    no softcap) except the selector, which ``DFlash2DraftModel`` requires; a softcap of 0 means none (as SGLang).

    Raises DrafterConfigError listing every problem (wrong architectures, missing keys, invalid values)."""
    values, problems = dflash_fields(cfg, DFLASH2_ARCHITECTURE)
    dflash = cfg.get("dflash_config") if isinstance(cfg, Mapping) else None
    if isinstance(dflash, Mapping):
        for key in ("selector_rank", "selector_top_k"):
            if key not in dflash:
                problems.append(("config_key_missing", f"config.json is missing key dflash_config.{key} "
                                                       "(DFlash2DraftModel requires the candidate selector)"))
        values.update({k: dflash.get(k, 0) for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                      "selector_top_k")})
        values["output_multiplier"] = dflash.get("output_multiplier", 1.0)
        cap = dflash.get("final_logit_softcapping")
        values["final_logit_softcapping"] = None if cap in (None, 0, 0.0) else cap
    return build_spec(DFlash2Spec, values, problems)


def describe(spec: DFlash2Spec) -> str:
    """The DFlash summary plus ``", conv 2 taps / group 8, selector rank 6 top-5"``."""
    conv = (f"conv {spec.conv_kernel_size} taps / group {spec.conv_group_size}" if spec.has_conv else "no conv")
    extra = f", {conv}, selector rank {spec.selector_rank} top-{spec.selector_top_k}"
    if spec.output_multiplier != 1.0 or spec.final_logit_softcapping is not None:
        extra += f", logits x{spec.output_multiplier} softcap {spec.final_logit_softcapping}"
    base = _dflash.describe(spec)
    head, dtype = base.rsplit(", ", 1)
    return f"{head}{extra}, {dtype}"


def init_rules(spec: DFlash2Spec) -> dict[str, str]:
    """Per-tensor init kinds for :func:`sglang_specopd.wire.drafters.init.init_drafter_tensors` (module
    docstring): conv identity, zero kernel projection, zero successor codebook."""
    rules = {"candidate_selector.successor_codebook": "zeros"}
    if spec.has_conv:
        for i in range(spec.num_hidden_layers):
            for side in ("attention_conv", "mlp_conv"):
                rules[f"layers.{i}.{side}.base_kernel"] = "conv_identity"
                rules[f"layers.{i}.{side}.kernel_projection.weight"] = "zeros"
    return rules


def spec_for_target(req: Any) -> DFlash2Spec:
    """A V2 spec for ``req``: the DFlash spec (:func:`sglang_specopd.wire.drafters.dflash.base_spec_for_target`) plus
    ``req.options`` over :data:`DEFAULTS` (conv_group_size defaults to head_dim when it divides hidden_size, else
    hidden_size). Raises DrafterSpecError (invalid/unknown options, invalid sizes), MaskTokenError."""
    base = _dflash.base_spec_for_target(req)
    group = base.head_dim if base.hidden_size % base.head_dim == 0 else base.hidden_size
    extra = _dflash.parse_options(req.options, {**DEFAULTS, "conv_group_size": group})
    if extra["conv_kernel_size"] == 0 and "conv_group_size" not in req.options:
        extra["conv_group_size"] = 0
    return DFlash2Spec(**{**base.__dict__, **extra})
