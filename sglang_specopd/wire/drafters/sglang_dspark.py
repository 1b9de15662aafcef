"""How SGLang 0.5.23 reads a DSpark drafter config.json (``DSparkDraftModel``), mirrored without importing SGLang.

Three readers, all run at launch, in this order: ``parse_dspark_draft_config``
(``srt/speculative/dspark_components/dspark_config.py``; nested ``dflash_config`` / ``dspark_config`` keys first,
then the top level), ``DSparkDraftMixin.__init__`` with ``build_markov_head`` / ``build_confidence_head``
(``srt/models/dspark.py``; these read the TOP-LEVEL ``markov_rank``, ``markov_head_type`` and
``confidence_head_with_markov`` only, so a Markov rank given only in ``dflash_config`` builds no head and is
refused), and the worker's ``resolve_runtime_config`` (the mask token id must be in the config). Messages are
SGLang's. Checked against SGLang itself by ``tests/test_published_drafters.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from sglang_specopd.wire.drafters.sglang_dflash import DEFAULT_DSPARK_GAMMA, DSPARK_MARKOV_HEAD_TYPES, DFlashView
from sglang_specopd.wire.drafters.sglang_dflash import SGLangRefusal, _dict, parse_dflash

PREFIXED_KEYS = ("dspark_block_size", "dspark_markov_rank", "dspark_markov_head_type", "dspark_noise_token_id",
                 "dspark_target_layer_ids")


@dataclass(frozen=True)
class DSparkView:
    """What SGLang serves for a DSpark config: ``gamma`` (drafted tokens per block; None = not in the config),
    ``mask_token_id`` (required), the Markov head the model builds (top-level keys), the confidence head's
    input, the anchor-first flag, and ``base`` (the DFlash reading)."""

    base: DFlashView
    gamma: Optional[int]
    mask_token_id: int
    markov_rank: int
    markov_head_type: str
    confidence_head_with_markov: bool
    sample_from_anchor: bool
    uses_prefixed: bool


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise SGLangRefusal(str(exc)) from None


def parse_dspark(view: Mapping[str, Any]) -> DSparkView:
    """The three readers of the module docstring on an :func:`~.sglang_dflash.hf_view`.

    Raises SGLangRefusal with SGLang's message (parse order: the DFlash fields, the Markov rank / head type /
    mask id of ``parse_dspark_draft_config``, ``markov_rank > 0`` (the target side's check, first at launch), the
    model's top-level Markov head, the confidence head, the worker's mask id)."""
    base = parse_dflash(view)
    nested = {**_dict(view.get("dflash_config")), **_dict(view.get("dspark_config"))}
    text = _dict(view.get("text_config")) or view
    pre = {k: view.get(k) for k in PREFIXED_KEYS}
    uses_prefixed = any(pre[k] is not None for k in PREFIXED_KEYS if k != "dspark_markov_head_type")
    raw_rank = pre["dspark_markov_rank"] if pre["dspark_markov_rank"] is not None else nested.get(
        "markov_rank", text.get("markov_rank", view.get("markov_rank", 0)))
    rank = _int(raw_rank) if raw_rank is not None else 0
    if rank < 0:
        raise SGLangRefusal(f"DSpark markov_rank must be >= 0, got {rank}.")
    head = pre["dspark_markov_head_type"] if pre["dspark_markov_head_type"] is not None else nested.get(
        "markov_head_type", text.get("markov_head_type", view.get("markov_head_type")))
    if rank > 0 and head is None and not uses_prefixed:
        raise SGLangRefusal("DSpark requires markov_head_type when markov_rank > 0, got None.")
    if head is not None and str(head).lower() not in DSPARK_MARKOV_HEAD_TYPES:
        raise SGLangRefusal(f"Unsupported DSpark markov_head_type={str(head).lower()!r}. "
                            f"Supported: {DSPARK_MARKOV_HEAD_TYPES}.")
    raw_mask = pre["dspark_noise_token_id"] if pre["dspark_noise_token_id"] is not None else nested.get(
        "mask_token_id", text.get("mask_token_id", view.get("mask_token_id", base.mask_token_id)))
    mask = _int(raw_mask) if raw_mask is not None else None
    if mask is not None and mask < 0:
        raise SGLangRefusal(f"DSpark mask_token_id must be non-negative, got {mask}.")
    gamma = _int(pre["dspark_block_size"]) if pre["dspark_block_size"] is not None else base.block_size
    if rank <= 0:
        raise SGLangRefusal(f"DSPARK requires markov_rank > 0 in the draft config, got markov_rank={rank}.")
    model_rank = _int(view.get("markov_rank", 0))
    if model_rank <= 0:
        raise SGLangRefusal("DSpark requires markov_rank > 0 (the Markov head is the core of the semi-AR draft); "
                            f"got markov_rank={model_rank}.")
    model_head = str(view.get("markov_head_type", "vanilla")).lower()
    if model_head not in DSPARK_MARKOV_HEAD_TYPES:
        raise SGLangRefusal(f"Unsupported DSpark markov_head_type={model_head!r}.")
    with_markov = bool(view.get("confidence_head_with_markov", model_rank > 0))
    if mask is None:
        raise SGLangRefusal("DSpark requires mask_token_id to be set in the draft model config.")
    return DSparkView(base, gamma, mask, model_rank, model_head, with_markov,
                      bool(view.get("sample_from_anchor", True)), uses_prefixed)


def served_gamma(parsed: DSparkView) -> int:
    """The gamma SGLang serves when launched without ``--speculative-dspark-block-size`` /
    ``--speculative-num-draft-tokens`` (``_handle_dspark``): the config's (prefixed ``dspark_block_size``, else
    ``block_size``), else :data:`~.sglang_dflash.DEFAULT_DSPARK_GAMMA` (7)."""
    return parsed.gamma if parsed.gamma is not None else DEFAULT_DSPARK_GAMMA


def check_runtime_mask(parsed: DSparkView, target_vocab_size: int) -> None:
    """``resolve_runtime_config``'s vocabulary check. Raises SGLangRefusal."""
    if parsed.mask_token_id >= target_vocab_size:
        raise SGLangRefusal(f"DSpark mask_token_id={parsed.mask_token_id} is outside the target vocab size "
                            f"{target_vocab_size}.")
