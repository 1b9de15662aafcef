"""A dummy drafter architecture (:data:`DUMMY`, ``DummyDraftModel``) for the drafter-architecture registry tests:
registered by a test (or by a subprocess standing in for an extension), never by the modules themselves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from sglang_specopd.wire.drafters.archs import DrafterArch
from sglang_specopd.wire.drafters.format import DrafterConfigError


@dataclass(frozen=True)
class DummySpec:
    hidden_size: int
    vocab_size: int
    num_target_layers: int
    width: int
    dtype: str = "float32"


def dummy_config(spec: DummySpec) -> dict[str, Any]:
    return {"architectures": ["DummyDraftModel"], "hidden_size": spec.hidden_size, "vocab_size": spec.vocab_size,
            "num_target_layers": spec.num_target_layers, "dummy_config": {"width": spec.width}, "dtype": spec.dtype}


def _dummy_parse(cfg: Mapping[str, Any]) -> DummySpec:
    if cfg.get("architectures") != ["DummyDraftModel"]:
        raise DrafterConfigError([("config_invalid", f"not a dummy drafter: {cfg.get('architectures')!r}")])
    try:
        return DummySpec(cfg["hidden_size"], cfg["vocab_size"], cfg["num_target_layers"], cfg["dummy_config"]["width"],
                         cfg["dtype"])
    except (KeyError, TypeError) as exc:
        raise DrafterConfigError([("config_key_missing", f"config.json is missing key {exc}")]) from None


def _dummy_tensors(spec: DummySpec) -> dict[str, tuple[int, ...]]:
    return {"proj.weight": (spec.width, spec.hidden_size), "norm.weight": (spec.width,)}


def _dummy_for_target(req: Any) -> DummySpec:
    info = req.target
    return DummySpec(info.hidden_size, info.vocab_size, info.num_hidden_layers, width=8 * req.num_layers,
                     dtype=req.dtype)


DUMMY = DrafterArch(
    name="dummy", architecture="DummyDraftModel", speculative_algorithm="DUMMY", sglang_worker="DummyWorker",
    spec_type=DummySpec, parse_config=_dummy_parse, expected_tensors=_dummy_tensors, config=dummy_config,
    describe=lambda s: f"dummy width {s.width}, {s.dtype}", spec_for_target=_dummy_for_target,
)
