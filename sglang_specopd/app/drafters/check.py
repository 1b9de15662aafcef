"""Validate a drafter checkpoint (any registered architecture) against its target, one readable problem per defect.

Pure (json/struct only, no torch). The architecture's entry in :mod:`sglang_specopd.wire.drafters.archs` parses the
config and names the tensors; the config is first resolved exactly as SGLang 0.5.23 resolves it
(:mod:`sglang_specopd.wire.drafters.layouts`), so a drafter SGLang serves passes and one it refuses fails with
SGLang's reason; then what SGLang silently tolerates but breaks serving (extra tensors, a last / duplicate /
unsorted context layer id, a hidden size other than the target's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from sglang_specopd.wire.checkpoint_info import TargetConfigError, TargetInfo, read_safetensors_header
from sglang_specopd.wire.checkpoint_info import read_target_info
from sglang_specopd.wire.drafters.archs import arch_for_spec, get_drafter_arch, resolve_drafter_config
from sglang_specopd.wire.drafters.format import DTYPES, DrafterConfigError, DrafterSpec, layer_id_problems
from sglang_specopd.wire.drafters.format import read_drafter_config
from sglang_specopd.wire.drafters.layouts import target_facts


@dataclass(frozen=True)
class Problem:
    """One defect: a stable machine-readable ``code`` (e.g. ``"tensor_missing"``) and a one-line ``message``."""

    code: str
    message: str

    def __str__(self) -> str:
        return self.message


class DrafterCheckError(Exception):
    """Raised by :func:`assert_drafter_ok`; ``problems`` lists every defect found (message: one per line)."""

    def __init__(self, drafter_dir: str | os.PathLike[str], problems: list[Problem]):
        self.drafter_dir = Path(drafter_dir)
        self.problems = list(problems)
        lines = "\n".join(p.message for p in self.problems)
        super().__init__(f"drafter {self.drafter_dir} failed {len(self.problems)} check(s):\n{lines}")


def target_problems(spec: Any, facts: Mapping[str, Any], info: TargetInfo) -> list[Problem]:
    """Problems of a parsed drafter against the target that SGLang does not catch at launch but that break
    serving. ``facts``: the entry's ``target_facts`` of the resolved config. A hidden size other than the
    target's (``fc`` takes K x the target's features); a vocabulary other than the target's, except for plain
    DFlash drafters (which own no vocabulary-sized tensor; DFlash V2 codebooks and DSpark's Markov head index the
    target head's ids); a layer count other than the target's; a last / duplicate / unsorted context layer id
    (never captured / captured once / fed to ``fc`` in another order than trained)."""
    out: list[Problem] = []
    checks = [("hidden_size", info.hidden_size, "hidden_size_mismatch"),
              ("num_target_layers", info.num_hidden_layers, "num_target_layers_mismatch")]
    if type(spec) is not DrafterSpec:
        checks.append(("vocab_size", info.vocab_size, "vocab_mismatch"))
    for key, want, code in checks:
        got = facts.get(key)
        if got is not None and got != want:
            target_key = "num_hidden_layers" if key == "num_target_layers" else key
            out.append(Problem(code, f"{key} {got!r} != target {target_key} {want}"))
    if "target_layer_ids" in facts:
        out += [Problem(c, m) for c, m in layer_id_problems(facts["target_layer_ids"], info.num_hidden_layers)]
    return out


def tensor_problems(spec: Any, drafter_dir: Path) -> list[Problem]:
    files = sorted(drafter_dir.glob("*.safetensors"))
    if not files:
        return [Problem("weights_missing", f"no *.safetensors file in {drafter_dir}")]
    out: list[Problem] = []
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in files:
        try:
            header = read_safetensors_header(f)
        except ValueError as exc:
            out.append(Problem("weights_unreadable", f"unreadable safetensors: {exc}"))
            continue
        for name, info in header.items():
            name = name.removeprefix("model.")  # SGLang's loader accepts an optional "model." prefix
            if name in found:
                out.append(Problem("tensor_duplicate", f"tensor {name} appears more than once ({f.name})"))
            found[name] = info
    if out:
        return out
    expected = arch_for_spec(spec).expected_tensors(spec)
    floats = set(DTYPES.values())
    for name, shape in expected.items():
        if name not in found:
            out.append(Problem("tensor_missing", f"missing tensor {name} {list(shape)}"))
        elif found[name][1] != shape:
            out.append(Problem("tensor_shape", f"tensor {name} has shape {list(found[name][1])}, expected "
                                               f"{list(shape)}"))
        elif found[name][0] not in floats:  # SGLang casts F32/BF16/F16 to the serving dtype on load
            out.append(Problem("tensor_dtype", f"tensor {name} has dtype {found[name][0]}, expected one of "
                                               f"{', '.join(sorted(floats))}"))
    out += [Problem("tensor_extra", f"extra tensor {name} {list(found[name][1])} (SGLang would silently ignore it)")
            for name in found if name not in expected]
    return out


@dataclass(frozen=True)
class CheckReport:
    """:func:`check_drafter_report`'s answer: ``problems`` (empty when the drafter is fine), ``spec`` (None when the
    config did not parse), ``used`` (what SGLang will use, key -> "value (where from)") and ``notes`` (SGLang's
    warnings for this drafter on this target)."""

    problems: list[Problem]
    spec: Any = None
    used: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def check_drafter_report(drafter_dir: str | os.PathLike[str], target_dir: str | os.PathLike[str],
                         arch: Optional[str] = None) -> CheckReport:
    """Check the drafter at ``drafter_dir`` (any published layout) for the HF target at ``target_dir``.

    ``arch`` (a registry name, e.g. ``"dflash"``) is the architecture expected; None accepts any registered one.
    The config is resolved against the target exactly as SGLang 0.5.23 resolves it
    (:func:`sglang_specopd.wire.drafters.archs.resolve_drafter_config`): what SGLang refuses is one problem with
    SGLang's message (code ``sglang_refuses``), what it serves but specopd cannot train or swap is
    ``unsupported_by_specopd``. Then: hidden size (and, for V2 / DSpark, vocabulary) equal to the target's,
    context layer ids not the last, distinct, increasing; safetensors readable (not truncated); exactly the
    expected tensor names and shapes, float dtypes. Never raises for a bad checkpoint; raises
    UnknownDrafterArchError for an unregistered ``arch``.
    """
    if arch is not None:
        get_drafter_arch(arch)
    d, t = Path(drafter_dir).expanduser(), Path(target_dir).expanduser()
    if not d.is_dir():
        return CheckReport([Problem("drafter_missing", f"drafter path does not exist: {d}")])
    problems: list[Problem] = []
    info: TargetInfo | None = None
    facts = None
    if not t.exists():
        problems.append(Problem("target_missing", f"target path does not exist: {t}"))
    else:
        try:
            info, facts = read_target_info(t), target_facts(str(t))
        except TargetConfigError as exc:
            problems.append(Problem("target_invalid", str(exc)))
        except ValueError as exc:
            problems.append(Problem("target_tokenizer_unreadable", str(exc)))
    spec: Any = None
    used: dict[str, str] = {}
    notes: tuple[str, ...] = ()
    try:
        spec, res = resolve_drafter_config(read_drafter_config(d), arch, facts, str(d))
        used, notes, resolved = res.used, res.notes, res.config
    except DrafterConfigError as exc:
        problems += [Problem(code, msg) for code, msg in exc.problems
                     if code != "needs_target" or facts is None and not problems]
    if info is not None and spec is not None:
        problems += target_problems(spec, arch_for_spec(spec).target_facts(resolved), info)
    if spec is not None:
        problems += tensor_problems(spec, d)
    unique: dict[tuple[str, str], Problem] = {}
    for p in problems:
        unique.setdefault((p.code, p.message), p)
    return CheckReport(list(unique.values()), spec, used, notes)


def check_drafter(drafter_dir: str | os.PathLike[str], target_dir: str | os.PathLike[str],
                  arch: Optional[str] = None) -> list[Problem]:
    """All problems of :func:`check_drafter_report`; an empty list when the drafter is fine."""
    return check_drafter_report(drafter_dir, target_dir, arch).problems


def assert_drafter_ok(drafter_dir: str | os.PathLike[str], target_dir: str | os.PathLike[str],
                      arch: Optional[str] = None) -> Any:
    """Return the drafter's spec if :func:`check_drafter` finds nothing; else raise DrafterCheckError."""
    report = check_drafter_report(drafter_dir, target_dir, arch)
    if report.problems:
        raise DrafterCheckError(drafter_dir, report.problems)
    return report.spec


def describe(spec: Any) -> str:
    """One-line summary used by ``specopd drafter check``/``init``: the entry's ``describe`` + parameter count."""
    entry = arch_for_spec(spec)
    n_params = sum(_prod(s) for s in entry.expected_tensors(spec).values())
    return f"{entry.describe(spec)}, {n_params / 1e6:.2f}M params"


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
