"""Validate a drafter checkpoint (any registered architecture) against its target, one readable problem per defect.

Pure (json/struct only, no torch). The architecture's entry in :mod:`sglang_specopd.wire.drafter_archs` parses the
config and names the tensors; the checks mirror what SGLang 0.5.23 needs (for DFlash see
:mod:`sglang_specopd.wire.drafter_format`) plus what it silently tolerates but is a bug for us (extra tensors,
unsorted/duplicate layer ids, a mask token that is not the tokenizer's token for its id).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from sglang_specopd.wire.checkpoint_info import TargetConfigError, TargetInfo, lookup_token_id, read_safetensors_header
from sglang_specopd.wire.checkpoint_info import read_target_info
from sglang_specopd.wire.drafter_archs import UnknownDrafterArchError, arch_for_config, arch_for_spec
from sglang_specopd.wire.drafter_archs import get_drafter_arch, load_drafter_spec, parse_drafter_config
from sglang_specopd.wire.drafter_format import DTYPES, DrafterConfigError, layer_id_problems, read_drafter_config


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


def _target_problems(facts: Mapping[str, Any], info: TargetInfo, target_dir: Path) -> list[Problem]:
    """Problems of a config's target facts (an entry's ``target_facts``) against the target."""
    out: list[Problem] = []
    for key, want, code in (("hidden_size", info.hidden_size, "hidden_size_mismatch"),
                            ("vocab_size", info.vocab_size, "vocab_mismatch"),
                            ("num_target_layers", info.num_hidden_layers, "num_target_layers_mismatch")):
        got = facts.get(key)
        if got is not None and got != want:
            target_key = "num_hidden_layers" if key == "num_target_layers" else key
            out.append(Problem(code, f"{key} {got!r} != target {target_key} {want}"))
    if "target_layer_ids" in facts:
        out += [Problem(c, m) for c, m in layer_id_problems(facts["target_layer_ids"], info.num_hidden_layers)]
    token, token_id = facts.get("mask_token"), facts.get("mask_token_id")
    if isinstance(token_id, int) and token_id >= info.vocab_size:
        out.append(Problem("mask_token_out_of_vocab",
                           f"mask_token_id {token_id} >= target vocab_size {info.vocab_size}"))
    if isinstance(token, str) and token and isinstance(token_id, int):
        try:
            found = lookup_token_id(target_dir, token)
        except ValueError as exc:
            out.append(Problem("target_tokenizer_unreadable", str(exc)))
        else:
            if found is None:
                out.append(Problem("mask_token_mismatch", f"mask_token {token!r} is not a token of the target "
                                                          "tokenizer"))
            elif found != token_id:
                out.append(Problem("mask_token_mismatch", f"mask_token_id {token_id} does not match the target "
                                                          f"tokenizer's id {found} for mask_token {token!r}"))
    return out


def _tensor_problems(spec: Any, drafter_dir: Path) -> list[Problem]:
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
    tag = DTYPES[spec.dtype]
    for name, shape in expected.items():
        if name not in found:
            out.append(Problem("tensor_missing", f"missing tensor {name} {list(shape)}"))
        elif found[name][1] != shape:
            out.append(Problem("tensor_shape", f"tensor {name} has shape {list(found[name][1])}, expected "
                                               f"{list(shape)}"))
        elif found[name][0] != tag:
            out.append(Problem("tensor_dtype", f"tensor {name} has dtype {found[name][0]}, config dtype "
                                               f"{spec.dtype} needs {tag}"))
    out += [Problem("tensor_extra", f"extra tensor {name} {list(found[name][1])} (SGLang would silently ignore it)")
            for name in found if name not in expected]
    return out


def check_drafter(drafter_dir: str | os.PathLike[str], target_dir: str | os.PathLike[str],
                  arch: Optional[str] = None) -> list[Problem]:
    """All problems of the drafter at ``drafter_dir`` for the HF target at ``target_dir``; empty list when ok.

    ``arch`` (a registry name, e.g. ``"dflash"``) is the architecture expected; None accepts any registered one.
    Checks: drafter dir and config.json exist and parse; ``architectures`` names a registered (the expected)
    architecture; required keys present and valid (the entry's spec rules, DrafterSpec for DFlash);
    hidden_size / vocab_size / num_target_layers equal the target's; target_layer_ids in range, not the
    target's last layer, no duplicates, increasing; block_size >= 2; mask_token_id < target vocab and equal to the
    tokenizer's id for mask_token; safetensors readable (not truncated); exactly the expected tensor names with the
    expected shapes and the config's dtype. Never raises for a bad checkpoint; raises UnknownDrafterArchError
    for an unregistered ``arch``.
    """
    if arch is not None:
        get_drafter_arch(arch)
    d, t = Path(drafter_dir).expanduser(), Path(target_dir).expanduser()
    if not d.is_dir():
        return [Problem("drafter_missing", f"drafter path does not exist: {d}")]
    problems: list[Problem] = []
    info: TargetInfo | None = None
    if not t.exists():
        problems.append(Problem("target_missing", f"target path does not exist: {t}"))
    else:
        try:
            info = read_target_info(t)
        except TargetConfigError as exc:
            problems.append(Problem("target_invalid", str(exc)))
    spec: Any = None
    cfg: Any = None
    try:
        cfg = read_drafter_config(d)
        spec = parse_drafter_config(cfg, arch)
    except DrafterConfigError as exc:
        problems += [Problem(code, msg) for code, msg in exc.problems]
    if info is not None and isinstance(cfg, dict):
        problems += _target_problems(_facts(cfg, arch), info, t)
    if spec is not None:
        problems += _tensor_problems(spec, d)
    unique: dict[tuple[str, str], Problem] = {}
    for p in problems:
        unique.setdefault((p.code, p.message), p)
    return list(unique.values())


def _facts(cfg: dict[str, Any], arch: Optional[str]) -> dict[str, Any]:
    """The target facts of ``cfg`` read by the entry it names (else the expected one's, else top-level keys)."""
    try:
        entry = arch_for_config(cfg)
    except UnknownDrafterArchError:
        if arch is None:
            return {k: cfg[k] for k in ("hidden_size", "vocab_size", "num_target_layers") if k in cfg}
        entry = get_drafter_arch(arch)
    return entry.target_facts(cfg)


def assert_drafter_ok(drafter_dir: str | os.PathLike[str], target_dir: str | os.PathLike[str],
                      arch: Optional[str] = None) -> Any:
    """Return the drafter's spec if :func:`check_drafter` finds nothing; else raise DrafterCheckError."""
    problems = check_drafter(drafter_dir, target_dir, arch)
    if problems:
        raise DrafterCheckError(drafter_dir, problems)
    return load_drafter_spec(drafter_dir, arch)


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
