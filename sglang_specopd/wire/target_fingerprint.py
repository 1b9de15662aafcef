"""A fingerprint of a target checkpoint: do two servers serve the same target model?

A trainer that talks to several workers (a fleet) must not mix their answers unless every worker serves the same
target (score_trees log-probs, context features, served traffic). Each worker reports
:func:`target_fingerprint` of its ``model_path`` in ``GET /specopd/drafter`` (``target.fingerprint``); the trainer
refuses a fleet whose workers disagree (:mod:`specopd_trainer.fleet.check`).

The fingerprint is ``"sha256:<64 hex>"`` over, in this order:

* ``config.json`` as canonical JSON (sorted keys), without ``transformers_version`` and keys starting with ``_``
  (a copy saved by another transformers release, or from another directory, is the same target);
* the bytes of the tokenizer files that exist (``tokenizer.json``, ``tokenizer.model``, ``vocab.json``,
  ``merges.txt``);
* every tensor of every ``*.safetensors`` file, by name (so a different sharding is the same target): its name,
  dtype, shape, byte length, and its first and last :data:`SAMPLE_BYTES` bytes of data;
* other weight files (``*.bin``, ``*.pt``, ``*.pth``, ``*.gguf``), by name: size and first and last
  :data:`FILE_SAMPLE_BYTES` bytes.

It reads a few KiB per tensor, never the whole weights (milliseconds for an 8B checkpoint). So two checkpoints
that differ only in bytes outside every tensor's sampled ends get the same fingerprint: it tells different models,
different trainings and different dtypes apart, not a deliberate edit in the middle of one tensor. A
``model_path`` that is not a directory (a hub id SGLang downloads itself) gets ``"name:<model_path>"``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

SAMPLE_BYTES = 4096
FILE_SAMPLE_BYTES = 65536
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt")
OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".gguf")
_MAX_HEADER = 100 * 2**20


class FingerprintError(ValueError):
    """The checkpoint cannot be fingerprinted (unreadable config, malformed safetensors header)."""


def _config_bytes(path: Path) -> bytes:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise FingerprintError(f"cannot read {path / 'config.json'}: {exc}") from None
    if not isinstance(cfg, dict):
        raise FingerprintError(f"{path / 'config.json'} is not a JSON object")
    kept = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "transformers_version"}
    return json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()


def _safetensors_header(fh, name: str) -> tuple:
    raw = fh.read(8)
    if len(raw) < 8:
        raise FingerprintError(f"{name}: shorter than a safetensors header")
    (n,) = struct.unpack("<Q", raw)
    if n > _MAX_HEADER:
        raise FingerprintError(f"{name}: safetensors header of {n} bytes")
    try:
        header = json.loads(fh.read(n))
    except ValueError as exc:
        raise FingerprintError(f"{name}: malformed safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise FingerprintError(f"{name}: safetensors header is not an object")
    return header, 8 + n


def _tensor_records(path: Path):
    """``(tensor name, file, data start, data end, dtype, shape)`` of every safetensors tensor, sorted by name."""
    out = []
    for f in sorted(path.glob("*.safetensors")):
        with open(f, "rb") as fh:
            header, base = _safetensors_header(fh, f.name)
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            try:
                lo, hi = (int(x) for x in meta["data_offsets"])
                out.append((name, f, base + lo, base + hi, str(meta["dtype"]), list(meta["shape"])))
            except (KeyError, TypeError, ValueError):
                raise FingerprintError(f"{f.name}: tensor {name!r} has a malformed header entry") from None
    return sorted(out, key=lambda r: r[0])


def _ends(fh, start: int, end: int, sample: int) -> bytes:
    """The first and last ``sample`` bytes of ``[start, end)`` (all of it when shorter than two samples)."""
    if end - start <= 2 * sample:
        fh.seek(start)
        return fh.read(end - start)
    fh.seek(start)
    head = fh.read(sample)
    fh.seek(end - sample)
    return head + fh.read(sample)


def target_fingerprint(model_path: str | os.PathLike[str]) -> str:
    """The fingerprint of the target at ``model_path`` (see the module docstring).

    Raises:
        FingerprintError: ``config.json`` is missing or not a JSON object, or a safetensors header is malformed.
    """
    path = Path(model_path)
    if not path.is_dir():
        return f"name:{model_path}"
    h = hashlib.sha256(b"specopd-target-fingerprint-v1\0")

    def part(tag: str, data: bytes) -> None:
        h.update(tag.encode() + b"\0" + len(data).to_bytes(8, "little") + data)

    part("config", _config_bytes(path))
    for name in TOKENIZER_FILES:
        if (path / name).is_file():
            part(name, (path / name).read_bytes())
    for name, f, start, end, dtype, shape in _tensor_records(path):
        with open(f, "rb") as fh:
            sample = _ends(fh, start, end, SAMPLE_BYTES)
        part("tensor", json.dumps([name, dtype, shape, end - start]).encode() + b"\0" + sample)
    for f in sorted(p for p in path.iterdir() if p.suffix in OTHER_WEIGHTS and p.is_file()):
        size = f.stat().st_size
        with open(f, "rb") as fh:
            sample = _ends(fh, 0, size, FILE_SAMPLE_BYTES)
        part("file", f.name.encode() + b"\0" + str(size).encode() + b"\0" + sample)
    return "sha256:" + h.hexdigest()
