"""The DSpark drafter checkpoint format SGLang 0.5.23 loads (``DSparkDraftModel``, ``--speculative-algorithm DSPARK``).

DSpark (DeepSeek DeepSpec) is the DFlash backbone plus a low-rank Markov head that makes the block
semi-autoregressive (step logits = base logits + a bias from the token drafted one step before) and a confidence
head (a per-slot acceptance logit). Verified against ``sglang/srt/models/dspark.py`` (``DSparkDraftModel``,
``build_markov_head``, ``build_confidence_head``, ``DSparkDraftMixin.load_weights``) and
``sglang/srt/speculative/dspark_components/dspark_config.py`` (``parse_dspark_draft_config``):

* config.json: the DFlash config with ``architectures: ["DSparkDraftModel"]``; top-level ``markov_rank`` (> 0)
  and ``markov_head_type`` (vanilla | gated | rnn), read there by ``build_markov_head``; top-level
  ``enable_confidence_head: true`` and ``confidence_head_with_markov`` (``build_confidence_head``); top-level
  ``sample_from_anchor`` (default true). ``dflash_config.block_size`` is gamma, the number of drafted tokens (the
  verify block is gamma + 1 tokens, SGLang's ``speculative_num_draft_tokens``).
* slot convention: with ``sample_from_anchor`` (the "anchor-first" default) the draft forward has gamma query rows
  ``[anchor, MASK x (gamma-1)]`` at positions ``a .. a+gamma-1`` and row i predicts the token at ``a+i+1``;
  without it, gamma+1 rows ``[anchor, MASK x gamma]`` and row i >= 1 predicts ``a+i`` (as DFlash).
  :class:`DSparkSpec` keeps specopd's convention: ``block_size`` = B = gamma + 1, the verify block (anchor +
  B-1 drafts), so ``--block-size 8`` drafts 7 tokens with either drafter; config.json stores gamma = B - 1.
* tensors: the DFlash ones plus ``markov_head.markov_w1.weight [V, r]`` (an embedding),
  ``markov_head.markov_w2.weight [V, r]`` (a Linear r -> V); gated: ``markov_head.gate_proj.{weight [r, H+r],
  bias [r]}``; rnn: ``markov_head.joint_proj.{weight [3r, 2r+H], bias [3r]}``; and
  ``confidence_head.proj.{weight [1, H (+ r with markov)], bias [1]}``. SGLang loads the confidence tensors only
  when ``SGLANG_RAGGED_VERIFY_MODE`` is not ``static`` (its default), and then requires them, so they are
  always written.
* init (:func:`init_rules`): ``markov_w2`` and every bias zero, so a fresh Markov head adds no bias and a fresh
  DSpark drafter proposes what a DFlash drafter with the same backbone proposes; other matrices N(0, 0.02).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from sglang_specopd.wire.drafters import dflash as _dflash
from sglang_specopd.wire.drafters.format import DrafterSpec, build_spec, dflash_fields, drafter_config
from sglang_specopd.wire.drafters.format import expected_tensors as dflash_tensors

DSPARK_ARCHITECTURE = "DSparkDraftModel"
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
DEFAULTS = {"markov_rank": 32, "markov_head_type": "vanilla", "confidence_head_with_markov": True,
            "sample_from_anchor": True}
_UNSUPPORTED_DFLASH_KEYS = ("conv_kernel_size", "selector_rank")


@dataclass(frozen=True)
class DSparkSpec(DrafterSpec):
    """A DSpark drafter: a :class:`DrafterSpec` (``block_size`` = gamma + 1, see the module docstring) plus the
    Markov and confidence heads. Validated on construction (raises DrafterSpecError listing every problem)."""

    markov_rank: int = 32
    markov_head_type: str = "vanilla"
    confidence_head_with_markov: bool = True
    sample_from_anchor: bool = True

    def _extra_problems(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        if not isinstance(self.markov_rank, int) or isinstance(self.markov_rank, bool) or self.markov_rank < 1:
            problems.append(("invalid_value", f"markov_rank must be an int >= 1 (DSpark requires the Markov head), "
                                              f"got {self.markov_rank!r}"))
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            problems.append(("invalid_value", f"markov_head_type must be one of {', '.join(MARKOV_HEAD_TYPES)}, "
                                              f"got {self.markov_head_type!r}"))
        for name in ("confidence_head_with_markov", "sample_from_anchor"):
            if not isinstance(getattr(self, name), bool):
                problems.append(("invalid_value", f"{name} must be true or false, got {getattr(self, name)!r}"))
        return problems

    @property
    def gamma(self) -> int:
        """Drafted tokens per block (config.json's ``dflash_config.block_size``): ``block_size - 1``."""
        return self.block_size - 1

    @property
    def num_query_rows(self) -> int:
        """Rows of the draft forward: gamma anchor-first, else gamma + 1."""
        return self.gamma if self.sample_from_anchor else self.block_size


def expected_tensors(spec: DSparkSpec) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor names -> shapes ``DSparkDraftModel`` loads for ``spec`` (DFlash tensors, Markov head,
    confidence head)."""
    out = dict(dflash_tensors(spec))
    v, r, h = spec.vocab_size, spec.markov_rank, spec.hidden_size
    out["markov_head.markov_w1.weight"] = (v, r)
    out["markov_head.markov_w2.weight"] = (v, r)
    if spec.markov_head_type == "gated":
        out["markov_head.gate_proj.weight"] = (r, h + r)
        out["markov_head.gate_proj.bias"] = (r,)
    elif spec.markov_head_type == "rnn":
        out["markov_head.joint_proj.weight"] = (3 * r, 2 * r + h)
        out["markov_head.joint_proj.bias"] = (3 * r,)
    out["confidence_head.proj.weight"] = (1, h + (r if spec.confidence_head_with_markov else 0))
    out["confidence_head.proj.bias"] = (1,)
    return out


def config(spec: DSparkSpec) -> dict[str, Any]:
    """The config.json dict of ``spec`` (module docstring): ``dflash_config.block_size`` is gamma."""
    cfg = drafter_config(spec)
    cfg["architectures"] = [DSPARK_ARCHITECTURE]
    cfg["dflash_config"]["block_size"] = spec.gamma
    cfg.update(markov_rank=spec.markov_rank, markov_head_type=spec.markov_head_type, enable_confidence_head=True,
               confidence_head_with_markov=spec.confidence_head_with_markov,
               sample_from_anchor=spec.sample_from_anchor)
    return cfg


def parse_config(cfg: Mapping[str, Any]) -> DSparkSpec:
    """Parse a DSpark config.json dict into a DSparkSpec (``block_size`` = config gamma + 1).

    Requires top-level ``markov_rank`` and ``markov_head_type`` (where ``DSparkDraftModel`` reads them; a copy in
    ``dflash_config`` / ``dspark_config``, which SGLang's config parser also reads, must agree). Defaults as SGLang:
    ``confidence_head_with_markov`` = true, ``sample_from_anchor`` = true. Refuses ``enable_confidence_head:
    false`` (SGLang 0.5.23 builds the head whenever ragged verify is on, regardless), the DFlash V2 conv /
    selector keys (SGLang would build them; specopd's DSpark drafter has neither) and the ``dspark_*`` keys of a
    head bundled in a target checkpoint (SGLang would read them first).

    Raises DrafterConfigError listing every problem."""
    values, problems = dflash_fields(cfg, DSPARK_ARCHITECTURE)
    if not isinstance(cfg, Mapping):
        return build_spec(DSparkSpec, values, problems)
    nested: dict[str, Any] = {}
    for section in ("dflash_config", "dspark_config"):  # SGLang's precedence: dspark_config over dflash_config
        if isinstance(cfg.get(section), Mapping):
            nested.update(cfg[section])
    for key in ("markov_rank", "markov_head_type"):
        if key not in cfg:
            problems.append(("config_key_missing", f"config.json is missing top-level key {key} "
                                                   f"(DSparkDraftModel reads config.{key})"))
        elif key in nested and nested[key] != cfg[key]:
            problems.append(("config_invalid", f"{key} {cfg[key]!r} (top level) and {nested[key]!r} "
                                               "(dflash_config/dspark_config) disagree"))
        else:
            values[key] = cfg[key].lower() if key == "markov_head_type" and isinstance(cfg[key], str) else cfg[key]
    if "markov_head_type" in values and values["markov_head_type"] not in MARKOV_HEAD_TYPES:
        problems.append(("invalid_value", f"markov_head_type must be one of {', '.join(MARKOV_HEAD_TYPES)}, "
                                          f"got {values.pop('markov_head_type')!r}"))
    if cfg.get("enable_confidence_head", True) is not True:
        problems.append(("config_invalid", "enable_confidence_head must be true: SGLang 0.5.23 builds (and then "
                                           "requires) the confidence head whenever ragged verify is on"))
    for key in _UNSUPPORTED_DFLASH_KEYS:
        if nested.get(key):
            problems.append(("config_invalid", f"dflash_config.{key} is not supported for DSpark drafters"))
    prefixed = sorted(k for k in cfg if k.startswith("dspark_") and k != "dspark_config")
    if prefixed:  # SGLang reads these (a head bundled in a target checkpoint) over everything else
        problems.append(("config_invalid", f"bundled-head keys {', '.join(prefixed)} are not supported; use "
                                           "dflash_config and the top-level markov keys"))
    values["confidence_head_with_markov"] = cfg.get("confidence_head_with_markov", True)
    values["sample_from_anchor"] = cfg.get("sample_from_anchor", True)
    if isinstance(values.get("block_size"), int) and not isinstance(values["block_size"], bool):
        values["block_size"] += 1  # gamma -> verify block
    return build_spec(DSparkSpec, values, problems)


def describe(spec: DSparkSpec) -> str:
    """The DFlash summary with ``block_size`` replaced by ``gamma 7 (verify block 8)``, plus the heads."""
    base = _dflash.describe(spec).replace(f"block_size {spec.block_size}",
                                          f"gamma {spec.gamma} (verify block {spec.block_size})")
    head, dtype = base.rsplit(", ", 1)
    conf = "with markov" if spec.confidence_head_with_markov else "hidden only"
    rows = "anchor-first" if spec.sample_from_anchor else "anchor + gamma masks"
    return (f"{head}, markov {spec.markov_head_type} rank {spec.markov_rank}, confidence head ({conf}), {rows}, "
            f"{dtype}")


def init_rules(spec: DSparkSpec) -> dict[str, str]:
    """Per-tensor init kinds (module docstring): ``markov_w2`` and all biases zero."""
    return {n: "zeros" for n in expected_tensors(spec) if n == "markov_head.markov_w2.weight" or n.endswith(".bias")}


def spec_for_target(req: Any) -> DSparkSpec:
    """A DSpark spec for ``req``: the DFlash spec (``req.block_size`` = B = gamma + 1) plus ``req.options`` over
    :data:`DEFAULTS`. Raises DrafterSpecError (invalid/unknown options, invalid sizes), MaskTokenError."""
    base = _dflash.base_spec_for_target(req)
    extra = _dflash.parse_options(req.options, DEFAULTS)
    return DSparkSpec(**{**base.__dict__, **extra})
