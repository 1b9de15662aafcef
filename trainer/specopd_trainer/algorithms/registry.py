"""Registry of training algorithms: name -> config model, recipe defaults, run function, data it trains on.

Every algorithm is one package under :mod:`specopd_trainer.algorithms` whose ``__init__`` calls :func:`register`
with an :class:`Algorithm`; the packages shipped with the trainer are listed in :data:`BUILTIN` and imported on the
first lookup. The app layer builds ``specopd train <name>`` from each entry (one CLI option per config field, its
default from the recipe, its help from the field's description), loads the data the algorithm declares, and calls
``algorithm.run(context, config)``. Adding an algorithm (e.g. Draft-OPD) is one new package plus one line in
:data:`BUILTIN`; no CLI module changes.

Importing an algorithm package must stay light (pydantic config only, no torch): ``specopd train --help`` lists
every registered algorithm. Run functions import their loops lazily.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Type

from pydantic import BaseModel

__all__ = ["AdaptContext", "Algorithm", "AlgorithmError", "BUILTIN", "NothingToTrain", "PushFn", "RunReport",
           "ShardingRefusedError", "TrainContext", "UnknownAlgorithmError", "adaptive", "algorithms", "fmt", "get", "names", "register",
           "unregister"]

# The algorithm packages of the trainer, imported (so registered) on the first lookup: one line per algorithm.
BUILTIN: Tuple[str, ...] = (
    "specopd_trainer.algorithms.specopd",
    "specopd_trainer.algorithms.sft",
    "specopd_trainer.algorithms.sequential_opd",
    "specopd_trainer.algorithms.draft_opd",
)

PushFn = Callable[[int, Any], Any]  # push(step, drafter): hot-swap the drafter into the server


class AlgorithmError(Exception):
    """A run stopped on a condition of the server or the data (e.g. rollouts without verify records); the message
    is for the user (the CLI prints it as one ``error:`` line, exit 1)."""


class NothingToTrain(AlgorithmError):
    """An adapt step found nothing to train on yet (no traffic, no fresh blocks): the adapter waits for traffic."""


class ShardingRefusedError(AlgorithmError):
    """An algorithm or setting that cannot run as asked under ``torchrun`` (e.g. sequential OPD sharded, fewer
    sequences per step than FSDP2 ranks): one line for the user, raised before any training step."""


class UnknownAlgorithmError(KeyError):
    """No algorithm registered under that name; the message lists the registered ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class TrainContext:
    """What the caller (the CLI, the main job) hands an algorithm's run function.

    drafter: the drafter to train in place (e.g. :class:`specopd_trainer.drafters.dflash.DFlashDrafter`).
    client: :class:`specopd_trainer.client.http.SpecOPDClient` of the live server. run_dir: checkpoints, metrics.jsonl
    (an existing run resumes). train / holdout: :class:`specopd_trainer.features.Sequence` lists (``data =
    "sequences"``); prompts: token-id lists (``data = "prompts"``). push: ``push(step, drafter)`` or None (no
    admin key; never None for algorithms with ``needs_push``). progress: draw progress bars.
    """

    drafter: Any
    client: Any
    run_dir: Path
    train: Sequence = ()
    holdout: Sequence = ()
    prompts: Sequence = ()
    push: Optional[PushFn] = None
    progress: bool = True


@dataclass(frozen=True)
class AdaptContext:
    """What ``specopd adapt`` (:mod:`specopd_trainer.adapt`) hands an algorithm's adapt-step factory.

    drafter: the candidate being trained in place. client: the live server's client (admin key). train: the
    adapter's training traffic, a live list of :class:`specopd_trainer.adapt.buffer.TrafficSequence` (token ids,
    context features, prompt length, the served verify records, the drafter version each was served by), oldest
    first; it changes between steps (new traffic in, oldest out). fresh_versions: ``() -> set`` of drafter versions
    whose served records are on-policy enough to replay (the deployed one and the last ``max_staleness`` before it).
    anchor: a frozen copy of the drafter the run started from (None: no retention term). retain: the fraction of each
    step's requests trained to keep the anchor's predictions where the anchor was right (not to forget what it served
    well; steps that support it, e.g. SFT's).
    """

    drafter: Any
    client: Any
    train: Sequence
    fresh_versions: Callable[[], Any]
    anchor: Any = None
    retain: float = 0.0


# step(gen) -> (loss: float, metrics with "supervised_tokens"): forward AND backward; the adapter steps the optimiser
AdaptStep = Callable[[Any], Tuple[float, Dict[str, Any]]]


@dataclass(frozen=True)
class RunReport:
    """A run's result: ``summary`` (the engine summary plus the algorithm's counters, e.g. ``steps``, ``loss``,
    ``wall_s``, ``metrics``) and ``rows``: (label, text) pairs for the end-of-run table (see :func:`fmt`)."""

    summary: Dict[str, Any]
    rows: Tuple[Tuple[str, str], ...]


def fmt(x: Any, nd: int = 4) -> str:
    """A report value as text: floats with ``nd`` decimals, lists of floats with 3, None as ``-``."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v, 3) for v in x) + "]"
    return str(x)


@dataclass(frozen=True)
class Algorithm:
    """One training algorithm.

    name: ``specopd train <name>``. title: its name in messages ("SpecOPD"). help: command help, first line the
    listing's summary. config: strict pydantic model (every field with a description; each becomes a CLI option).
    run: ``run(context, config) -> RunReport``, called on every rank. recipe: validated settings that override
    the config's field defaults (the CLI defaults and :meth:`make_config`). data: ``"sequences"`` (reference
    responses with context features) or ``"prompts"`` (token ids to roll out). needs_push: the run pushes the
    drafter into the server (an admin key is required). distributed: the run may run under ``torchrun``.
    version_prefix: pushed versions are ``<prefix>-<run dir name>-step<N>`` (default: ``name``). flags: config
    field -> CLI flag for fields whose flag is not ``--field-name``. hidden: config fields with no CLI option.
    adapt: ``adapt(context: AdaptContext, config) -> AdaptStep`` when the algorithm can learn from served traffic
    (``specopd adapt --algorithm <name>``), else None; the step runs forward and backward on the current traffic and
    raises :class:`NothingToTrain` while there is nothing to train on.
    """

    name: str
    title: str
    help: str
    config: Type[BaseModel]
    run: Callable[[TrainContext, Any], RunReport]
    recipe: Mapping[str, Any] = field(default_factory=dict)
    data: Literal["sequences", "prompts"] = "sequences"
    needs_push: bool = False
    distributed: bool = True
    version_prefix: str = ""
    flags: Mapping[str, str] = field(default_factory=dict)
    hidden: Tuple[str, ...] = ()
    adapt: Optional[Callable[[AdaptContext, Any], AdaptStep]] = None

    def __post_init__(self):
        fields = self.config.model_fields
        for what, keys in (("recipe", self.recipe), ("flags", self.flags), ("hidden", self.hidden)):
            unknown = [k for k in keys if k not in fields]
            if unknown:
                raise ValueError(f"algorithm {self.name!r}: {what} names {unknown} that are not fields of "
                                 f"{self.config.__name__}")
        if self.data not in ("sequences", "prompts"):
            raise ValueError(f"algorithm {self.name!r}: data must be 'sequences' or 'prompts', got {self.data!r}")

    @property
    def summary(self) -> str:
        """The first line of :attr:`help`."""
        return inspect.cleandoc(self.help).splitlines()[0] if self.help.strip() else ""

    @property
    def prefix(self) -> str:
        """Prefix of pushed drafter versions."""
        return self.version_prefix or self.name

    def defaults(self) -> Dict[str, Any]:
        """Every config field's default, the recipe's value where it has one (not validated)."""
        out = {k: f.get_default(call_default_factory=True) for k, f in self.config.model_fields.items()}
        out.update(self.recipe)
        return out

    def make_config(self, **overrides) -> BaseModel:
        """The config of the recipe with ``overrides``; raises pydantic.ValidationError on bad values."""
        return self.config(**{**self.recipe, **overrides})

    def flag(self, field_name: str) -> str:
        """The CLI flag of config field ``field_name`` (``--anchors`` for ``anchors_per_seq``, else ``--a-b``)."""
        return self.flags.get(field_name) or "--" + field_name.replace("_", "-")

    def option_fields(self) -> List[str]:
        """Config fields exposed as CLI options, in declaration order."""
        return [k for k in self.config.model_fields if k not in self.hidden]


_REGISTRY: Dict[str, Algorithm] = {}
_LOADED = False


def _load_builtin() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for module in BUILTIN:
        importlib.import_module(module)


def lazy_run(target: str) -> Callable[[TrainContext, Any], RunReport]:
    """A run function that imports ``"package.module:function"`` on its first call, so that registering an
    algorithm (and listing it in the CLI) does not import torch or the training loop."""
    module, _, attr = target.partition(":")

    def run(ctx: TrainContext, cfg: Any) -> RunReport:
        return getattr(importlib.import_module(module), attr)(ctx, cfg)

    run.__qualname__ = run.__name__ = f"lazy_run({target})"
    return run


def lazy_adapt(target: str) -> Callable[[AdaptContext, Any], AdaptStep]:
    """An adapt-step factory that imports ``"package.module:function"`` on its first call (see :func:`lazy_run`)."""
    module, _, attr = target.partition(":")

    def adapt(ctx: AdaptContext, cfg: Any) -> AdaptStep:
        return getattr(importlib.import_module(module), attr)(ctx, cfg)

    adapt.__qualname__ = adapt.__name__ = f"lazy_adapt({target})"
    return adapt


def adaptive() -> List[str]:
    """Names of the registered algorithms that can learn from served traffic (``Algorithm.adapt`` set)."""
    return [a.name for a in algorithms() if a.adapt is not None]


def register(algorithm: Algorithm) -> Algorithm:
    """Add ``algorithm`` under its name; returns it. Raises ValueError if another algorithm has that name."""
    known = _REGISTRY.get(algorithm.name)
    if known is not None and known is not algorithm:
        raise ValueError(f"training algorithm {algorithm.name!r} is already registered")
    _REGISTRY[algorithm.name] = algorithm
    return algorithm


def unregister(name: str) -> None:
    """Remove ``name`` (tests registering a throw-away algorithm). Unknown names are ignored."""
    _REGISTRY.pop(name, None)


def _builtin_rank(algorithm: Algorithm) -> int:
    module = algorithm.config.__module__
    return next((i for i, m in enumerate(BUILTIN) if module == m or module.startswith(m + ".")), len(BUILTIN))


def algorithms() -> List[Algorithm]:
    """Every registered :class:`Algorithm`: the built-in ones in :data:`BUILTIN` order, then the others in
    registration order."""
    _load_builtin()
    return sorted(_REGISTRY.values(), key=_builtin_rank)


def names() -> List[str]:
    """Registered algorithm names (order of :func:`algorithms`)."""
    return [a.name for a in algorithms()]


def get(name: str) -> Algorithm:
    """The algorithm registered under ``name``. Raises :class:`UnknownAlgorithmError` listing the valid names."""
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownAlgorithmError(f"unknown training algorithm {name!r}; registered: "
                                    f"{', '.join(names())}") from None
