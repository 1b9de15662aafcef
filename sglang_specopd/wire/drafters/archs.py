"""The one registry of drafter architectures, read by the trainer, the in-server plugin and the CLI.

An entry (:class:`DrafterArch`) says everything that differs between drafter kinds: the registry name
(``"dflash"``), the HF ``architectures`` string SGLang loads (``"DFlashDraftModel"``), the SGLang speculative
algorithm / draft worker it serves under, how to parse and validate its config.json into a spec (a frozen
dataclass with a ``dtype`` field), the checkpoint tensor names/shapes of a spec, and how to write its config.
The trainer maps the same name to its ``nn.Module`` class (:mod:`specopd_trainer.drafters.registry`), the server
refuses swaps across architectures, ``specopd drafter init|check --arch`` offers the registered names.

Built-in entries are registered at the bottom of this module: DFlash (:mod:`.format`, hooks
:mod:`.dflash`), DFlash V2 ``DFlash2DraftModel`` (:mod:`.dflash2`) and DSpark ``DSparkDraftModel``
(:mod:`.dspark`). Others (tests, extensions) call :func:`register_drafter_arch` before they are looked up.
The registry is per process: the server knows only what its own process registered.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from sglang_specopd.wire.drafters import dflash as _dflash
from sglang_specopd.wire.drafters import dflash2 as _dflash2
from sglang_specopd.wire.drafters import dspark as _dspark
from sglang_specopd.wire.checkpoint_info import TargetInfo
from sglang_specopd.wire.drafters.layouts import Resolution, TargetFacts, canonical_config
from sglang_specopd.wire.drafters.format import DRAFTER_ARCHITECTURE, DrafterConfigError, DrafterSpec, drafter_config
from sglang_specopd.wire.drafters.format import expected_tensors, read_drafter_config, spec_from_config
from sglang_specopd.wire.drafters.format import write_config_json

_TARGET_FACT_KEYS = ("hidden_size", "vocab_size", "num_target_layers")


class UnknownDrafterArchError(KeyError):
    """A registry name, HF architecture or spec type that no registered drafter architecture has.
    The message names the registered ones; ``known`` lists their registry names."""

    def __init__(self, message: str):
        super().__init__(message)
        self.known = sorted(_ARCHS)

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class DrafterInitRequest:
    """What ``specopd drafter init`` knows when it asks an architecture for a fresh spec.

    ``target_layer_ids``/``num_context_layers`` are None when not given (the arch picks its default);
    ``resolve_mask_token()`` returns ``(token, id)`` for the target (the ``--mask-token`` override or the
    tokenizer rule of :func:`sglang_specopd.wire.drafters.init.choose_mask_token`; raises MaskTokenError) and is
    called only by architectures that use a mask token. ``dtype`` is one of float32, bfloat16, float16.
    ``options``: architecture-specific settings (``--option KEY=VALUE``, values as given: strings from the CLI);
    an architecture raises DrafterSpecError for a key it does not take.
    """

    target_dir: Path
    target: TargetInfo
    num_layers: int
    block_size: int
    target_layer_ids: Optional[tuple[int, ...]]
    num_context_layers: Optional[int]
    dtype: str
    resolve_mask_token: Callable[[], tuple[str, int]]
    options: Mapping[str, Any] = field(default_factory=dict)


def _top_level_facts(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {k: cfg[k] for k in _TARGET_FACT_KEYS if k in cfg}


def _default_describe(spec: Any) -> str:
    return f"{type(spec).__name__}, {spec.dtype}"


def _no_init_rules(spec: Any) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class DrafterArch:
    """One drafter architecture (frozen; compare by value).

    Attributes:
        name: registry name, e.g. ``"dflash"`` (CLI ``--arch``, trainer registry key).
        architecture: the ``config.json`` ``architectures[0]`` SGLang loads, e.g. ``"DFlashDraftModel"``.
        speculative_algorithm: SGLang ``--speculative-algorithm`` it serves under, e.g. ``"DFLASH"``.
        sglang_worker: name of SGLang's draft worker class, e.g. ``"DFlashWorkerV2"`` (documentation; the wire
            layer never imports SGLang).
        spec_type: the frozen dataclass of its specs (must have a ``dtype`` field: float32/bfloat16/float16).
        parse_config: config.json dict -> spec; raises DrafterConfigError listing every problem (wrong
            ``architectures`` included).
        expected_tensors: spec -> ordered ``{checkpoint tensor name: shape}`` (exactly what SGLang loads).
        config: spec -> config.json dict (``parse_config(config(spec)) == spec``).
        target_facts: raw config dict -> the facts checked against a target, each optional: hidden_size,
            vocab_size, num_target_layers, target_layer_ids, mask_token, mask_token_id (default: the first three
            top-level keys).
        describe: spec -> one-line summary (without the parameter count).
        spec_for_target: DrafterInitRequest -> spec, or None if ``specopd drafter init`` cannot create it.
        init_rules: spec -> ``{tensor name: kind}`` overriding the fresh-weight rule of
            :func:`sglang_specopd.wire.drafters.init.init_drafter_tensors` (kinds: ``"normal"``, ``"ones"``,
            ``"zeros"``, ``"conv_identity"``); default: none.
    """

    name: str
    architecture: str
    speculative_algorithm: str
    sglang_worker: str
    spec_type: type
    parse_config: Callable[[Mapping[str, Any]], Any]
    expected_tensors: Callable[[Any], dict[str, tuple[int, ...]]]
    config: Callable[[Any], dict[str, Any]]
    target_facts: Callable[[Mapping[str, Any]], dict[str, Any]] = _top_level_facts
    describe: Callable[[Any], str] = _default_describe
    spec_for_target: Optional[Callable[[DrafterInitRequest], Any]] = None
    init_rules: Callable[[Any], dict[str, str]] = _no_init_rules

    @property
    def label(self) -> str:
        """``"'DFlashDraftModel' (dflash)"``: how errors name this architecture."""
        return f"{self.architecture!r} ({self.name})"


_ARCHS: dict[str, DrafterArch] = {}


def _registered() -> str:
    return ", ".join(a.label for _, a in sorted(_ARCHS.items())) or "none"


def register_drafter_arch(arch: DrafterArch) -> DrafterArch:
    """Add ``arch`` to the registry and return it; registering an equal entry again is a no-op.

    Raises:
        ValueError: empty name/architecture, a spec type that is not a dataclass with a ``dtype`` field, or a
            name, architecture or spec type already taken by a different entry.
    """
    if not isinstance(arch.name, str) or not arch.name or not isinstance(arch.architecture, str) \
            or not arch.architecture:
        raise ValueError(f"a drafter architecture needs a non-empty name and architecture, got {arch.label}")
    if not (isinstance(arch.spec_type, type) and is_dataclass(arch.spec_type)
            and "dtype" in {f.name for f in fields(arch.spec_type)}):
        raise ValueError(f"drafter architecture {arch.name!r}: spec_type must be a dataclass with a dtype field")
    for other in _ARCHS.values():
        if other == arch:
            return arch
        if other.name == arch.name or other.architecture == arch.architecture or other.spec_type is arch.spec_type:
            raise ValueError(f"cannot register drafter architecture {arch.label}: {other.label} already has that "
                             "name, architecture or spec type")
    _ARCHS[arch.name] = arch
    return arch


def unregister_drafter_arch(name: str) -> DrafterArch:
    """Remove and return the entry ``name`` (tests, reloading extensions). Raises UnknownDrafterArchError."""
    arch = get_drafter_arch(name)
    del _ARCHS[name]
    return arch


def drafter_arch_names() -> list[str]:
    """Sorted registry names of all registered drafter architectures (``["dflash", ...]``)."""
    return sorted(_ARCHS)


def get_drafter_arch(name: str) -> DrafterArch:
    """The entry registered as ``name``. Raises UnknownDrafterArchError naming the registered ones."""
    try:
        return _ARCHS[name]
    except (KeyError, TypeError):
        raise UnknownDrafterArchError(f"unknown drafter architecture {name!r}; registered: {_registered()}") from None


def arch_for_architecture(architecture: Any) -> DrafterArch:
    """The entry whose HF ``architecture`` string is ``architecture``. Raises UnknownDrafterArchError."""
    for arch in _ARCHS.values():
        if arch.architecture == architecture:
            return arch
    raise UnknownDrafterArchError(f"architecture {architecture!r} is not a registered drafter architecture; "
                                  f"registered: {_registered()}")


def arch_for_config(cfg: Any) -> DrafterArch:
    """The entry named by ``cfg["architectures"]``, which must be a one-element list of a registered architecture.

    Raises:
        UnknownDrafterArchError: ``cfg`` is not a mapping, or its ``architectures`` is missing, not a one-element
            list, or names no registered architecture (the message quotes the value: "architectures [...] is not
            a registered drafter architecture; registered: ...").
    """
    value = cfg.get("architectures") if isinstance(cfg, Mapping) else None
    if isinstance(value, list) and len(value) == 1:
        for arch in _ARCHS.values():
            if arch.architecture == value[0]:
                return arch
    raise UnknownDrafterArchError(f"architectures {value!r} is not a registered drafter architecture; "
                                  f"registered: {_registered()}")


def arch_for_spec(spec: Any) -> DrafterArch:
    """The entry whose ``spec_type`` is ``type(spec)``. Raises UnknownDrafterArchError."""
    for arch in _ARCHS.values():
        if type(spec) is arch.spec_type:
            return arch
    raise UnknownDrafterArchError(f"no registered drafter architecture has spec type {type(spec).__name__}; "
                                  f"registered: {_registered()}")


def resolve_drafter_config(cfg: Any, arch: Optional[str] = None, target: Optional[TargetFacts] = None,
                           path: str = "config.json") -> tuple[Any, Resolution]:
    """Parse a drafter config.json dict, in any published layout, into the spec of the architecture it names and
    the :class:`~sglang_specopd.wire.drafters.layouts.Resolution` (what SGLang will use, and its warnings).

    ``arch`` (a registry name) is the architecture expected: a config naming another registered architecture is
    one ``arch_mismatch`` problem; any other config is parsed by ``arch``'s own parser (which reports a wrong
    ``architectures`` along with every other defect). Without ``arch`` an unregistered ``architectures`` is one
    ``config_invalid`` problem. DFlash-family configs are first resolved as SGLang 0.5.23 resolves them
    (:func:`~sglang_specopd.wire.drafters.layouts.canonical_config`; against ``target`` when given).

    Raises:
        DrafterConfigError: not a JSON object, unknown / unexpected architecture, what SGLang refuses
            (``sglang_refuses``, SGLang's message), ``unsupported_by_specopd``, ``needs_target``, or the entry's
            own problems.
        UnknownDrafterArchError: ``arch`` itself is not registered.
    """
    expected = get_drafter_arch(arch) if arch is not None else None
    if not isinstance(cfg, Mapping):
        raise DrafterConfigError([("config_malformed",
                                   f"config.json must hold a JSON object, got {type(cfg).__name__}")])
    try:
        named = arch_for_config(cfg)
    except UnknownDrafterArchError as exc:
        if expected is None and "speculators_model_type" not in cfg:
            raise DrafterConfigError([("config_invalid", str(exc))]) from None
        named = expected
    if expected is not None and named is not expected:
        raise DrafterConfigError([("arch_mismatch", f"config.json describes a {named.label} drafter, expected "
                                                    f"a {expected.label} drafter")])
    resolution = canonical_config(cfg, target, path)
    if named is None:  # a speculators export canonical_config did not refuse: cannot happen, but stay typed
        raise DrafterConfigError([("config_invalid", f"architectures {cfg.get('architectures')!r} is not a "
                                                      f"registered drafter architecture; registered: {_registered()}")])
    return named.parse_config(resolution.config), resolution


def parse_drafter_config(cfg: Any, arch: Optional[str] = None, target: Optional[TargetFacts] = None) -> Any:
    """The spec of :func:`resolve_drafter_config` (same arguments and errors)."""
    return resolve_drafter_config(cfg, arch, target)[0]


def load_drafter_spec(drafter_dir: str | os.PathLike[str], arch: Optional[str] = None,
                      target: Optional[TargetFacts] = None) -> Any:
    """Read ``drafter_dir/config.json`` into the spec of its architecture (see :func:`resolve_drafter_config`).

    Raises: DrafterConfigError (missing/malformed file, unknown or unexpected architecture, invalid values, what
    SGLang refuses), UnknownDrafterArchError (``arch`` not registered)."""
    if arch is not None:
        get_drafter_arch(arch)
    return resolve_drafter_config(read_drafter_config(drafter_dir), arch, target, str(Path(drafter_dir)))[0]


def write_drafter_arch_config(spec: Any, out_dir: str | os.PathLike[str]) -> Path:
    """Atomically write the config.json of ``spec``'s architecture into ``out_dir``; return its path.
    Raises UnknownDrafterArchError when ``type(spec)`` is not registered."""
    return write_config_json(arch_for_spec(spec).config(spec), out_dir)


def spec_as_dict(spec: Any) -> dict[str, Any]:
    """``dataclasses.asdict(spec)`` with tuple values as lists (JSON-friendly), for any registered spec."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(spec).items()}


# ---- built-in architectures (the one table) ------------------------------------------------------------------
DFLASH = register_drafter_arch(DrafterArch(
    name="dflash", architecture=DRAFTER_ARCHITECTURE, speculative_algorithm="DFLASH", sglang_worker="DFlashWorkerV2",
    spec_type=DrafterSpec, parse_config=spec_from_config, expected_tensors=expected_tensors, config=drafter_config,
    target_facts=_dflash.target_facts, describe=_dflash.describe, spec_for_target=_dflash.spec_for_target,
))
DFLASH2 = register_drafter_arch(DrafterArch(
    name="dflash2", architecture=_dflash2.DFLASH2_ARCHITECTURE, speculative_algorithm="DFLASH",
    sglang_worker="DFlashWorkerV2", spec_type=_dflash2.DFlash2Spec, parse_config=_dflash2.parse_config,
    expected_tensors=_dflash2.expected_tensors, config=_dflash2.config, target_facts=_dflash.target_facts,
    describe=_dflash2.describe, spec_for_target=_dflash2.spec_for_target, init_rules=_dflash2.init_rules,
))
DSPARK = register_drafter_arch(DrafterArch(
    name="dspark", architecture=_dspark.DSPARK_ARCHITECTURE, speculative_algorithm="DSPARK",
    sglang_worker="DSparkWorkerV2", spec_type=_dspark.DSparkSpec, parse_config=_dspark.parse_config,
    expected_tensors=_dspark.expected_tensors, config=_dspark.config, target_facts=_dflash.target_facts,
    describe=_dspark.describe, spec_for_target=_dspark.spec_for_target, init_rules=_dspark.init_rules,
))
