"""Validate a DFlash drafter checkpoint against its target, one readable problem per defect.

Pure (json/struct only, no torch): safe to call in the server before a hot swap. The checks mirror what SGLang
0.5.23 needs (see :mod:`sglang_specopd.wire.drafter_format`) plus what it silently tolerates but is a bug for us
(extra tensors, unsorted/duplicate layer ids, a mask token that is not the tokenizer's token for its id).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_specopd.wire.checkpoint_info import TargetConfigError, TargetInfo, lookup_token_id, read_safetensors_header
from sglang_specopd.wire.checkpoint_info import read_target_info
from sglang_specopd.wire.drafter_format import DTYPES, DrafterConfigError, DrafterSpec, expected_tensors
from sglang_specopd.wire.drafter_format import layer_id_problems, read_drafter_spec


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


def _target_problems(cfg: dict[str, Any], info: TargetInfo, target_dir: Path) -> list[Problem]:
    out: list[Problem] = []
    for key, want, code in (("hidden_size", info.hidden_size, "hidden_size_mismatch"),
                            ("vocab_size", info.vocab_size, "vocab_mismatch"),
                            ("num_target_layers", info.num_hidden_layers, "num_target_layers_mismatch")):
        got = cfg.get(key)
        if got is not None and got != want:
            target_key = "num_hidden_layers" if key == "num_target_layers" else key
            out.append(Problem(code, f"{key} {got!r} != target {target_key} {want}"))
    dflash = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    if "target_layer_ids" in dflash:
        out += [Problem(c, m) for c, m in layer_id_problems(dflash["target_layer_ids"], info.num_hidden_layers)]
    token, token_id = dflash.get("mask_token"), dflash.get("mask_token_id")
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


def _tensor_problems(spec: DrafterSpec, drafter_dir: Path) -> list[Problem]:
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
    expected = expected_tensors(spec)
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


def check_drafter(drafter_dir: str | os.PathLike[str], target_dir: str | os.PathLike[str]) -> list[Problem]:
    """All problems of the drafter at ``drafter_dir`` for the HF target at ``target_dir``; empty list when ok.

    Checks: drafter dir and config.json exist and parse; required keys present and valid (DrafterSpec rules);
    hidden_size / vocab_size / num_target_layers equal the target's; target_layer_ids in range, not the
    target's last layer, no duplicates, increasing; block_size >= 2; mask_token_id < target vocab and equal to the
    tokenizer's id for mask_token; safetensors readable (not truncated); exactly the expected tensor names with the
    expected shapes and the config's dtype. Never raises for a bad checkpoint (only for programming errors).
    """
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
    spec: DrafterSpec | None = None
    try:
        spec = read_drafter_spec(d)
    except DrafterConfigError as exc:
        problems += [Problem(code, msg) for code, msg in exc.problems]
    try:
        cfg = json.loads((d / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        cfg = None
    if info is not None and isinstance(cfg, dict):
        problems += _target_problems(cfg, info, t)
    if spec is not None:
        problems += _tensor_problems(spec, d)
    unique: dict[tuple[str, str], Problem] = {}
    for p in problems:
        unique.setdefault((p.code, p.message), p)
    return list(unique.values())


def assert_drafter_ok(drafter_dir: str | os.PathLike[str], target_dir: str | os.PathLike[str]) -> DrafterSpec:
    """Return the drafter's spec if :func:`check_drafter` finds nothing; else raise DrafterCheckError."""
    problems = check_drafter(drafter_dir, target_dir)
    if problems:
        raise DrafterCheckError(drafter_dir, problems)
    return read_drafter_spec(drafter_dir)


def describe(spec: DrafterSpec) -> str:
    """One-line summary used by ``specopd drafter check``/``init``."""
    n_params = sum(_prod(s) for s in expected_tensors(spec).values())
    return (f"{spec.num_hidden_layers} layers x hidden {spec.hidden_size} ({spec.num_attention_heads}/"
            f"{spec.num_key_value_heads} heads), block_size {spec.block_size}, target_layer_ids "
            f"{list(spec.target_layer_ids)} of {spec.num_target_layers}, mask {spec.mask_token!r} "
            f"(id {spec.mask_token_id}), {spec.dtype}, {n_params / 1e6:.2f}M params")


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
