"""Read facts about HF checkpoints without loading weights: safetensors headers, target config, token ids.

Pure (json/struct only; ``lookup_token_id`` falls back to transformers only when there is no tokenizer.json).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TargetConfigError(ValueError):
    """A target config.json that is missing, malformed or lacks a required field."""


@dataclass(frozen=True)
class TargetInfo:
    """The target-model facts a drafter depends on, read from the target's config.json.

    Defaults follow transformers: num_key_value_heads = num_attention_heads, head_dim = hidden_size //
    num_attention_heads, rope_theta 10000, rms_norm_eps 1e-6, max_position_embeddings 2048, dtype float32.
    ``rope_type`` is ``rope_parameters.rope_type`` (``"default"`` when absent).
    """

    path: Path
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_type: str
    vocab_size: int
    max_position_embeddings: int
    dtype: str


def read_target_info(target_dir: str | os.PathLike[str]) -> TargetInfo:
    """Read ``target_dir/config.json`` (a nested ``text_config`` is used when present).

    Raises:
        TargetConfigError: the file is missing/unreadable/not a JSON object, or lacks hidden_size,
            num_hidden_layers, num_attention_heads, intermediate_size or vocab_size (a mixture-of-experts config
            without ``intermediate_size`` gives its ``shared_expert_intermediate_size``, else its
            ``moe_intermediate_size``).
    """
    path = Path(target_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise TargetConfigError(f"target config does not exist: {path}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TargetConfigError(f"target config is not valid JSON: {path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise TargetConfigError(f"target config is not a JSON object: {path}")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    text = dict(text)
    if not isinstance(text.get("intermediate_size"), int):  # a mixture-of-experts target: the dense MLP width a
        # drafter takes is its shared expert's (Qwen3-Next, Qwen4-Exp), else one routed expert's
        text["intermediate_size"] = next((text[k] for k in ("shared_expert_intermediate_size", "moe_intermediate_size")
                                          if isinstance(text.get(k), int)), None)
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                           "vocab_size") if not isinstance(text.get(k), int)]
    if missing:
        raise TargetConfigError(f"target config {path} lacks integer field(s): {', '.join(missing)}")
    rope = text.get("rope_parameters") if isinstance(text.get("rope_parameters"), dict) else {}
    heads = int(text["num_attention_heads"])
    return TargetInfo(
        path=Path(target_dir),
        model_type=str(text.get("model_type", cfg.get("model_type", ""))),
        hidden_size=int(text["hidden_size"]),
        num_hidden_layers=int(text["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
        intermediate_size=int(text["intermediate_size"]),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10000.0))),
        rope_type=str(rope.get("rope_type", "default")),
        vocab_size=int(text["vocab_size"]),
        max_position_embeddings=int(text.get("max_position_embeddings", 2048)),
        dtype=str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"),
    )


def read_tokenizer_vocab(target_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Token string -> id of the target's tokenizer: ``tokenizer.json``'s model vocab with its added tokens over it;
    without that file, ``AutoTokenizer.get_vocab()``. Raises ValueError when no tokenizer can be read."""
    path = Path(target_dir) / "tokenizer.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from None
        vocab: Any = (data.get("model") or {}).get("vocab")
        out: dict[str, int] = {}
        if isinstance(vocab, dict):
            out = {str(k): int(v) for k, v in vocab.items()}
        elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            for i, (piece, _) in enumerate(vocab):
                out.setdefault(piece, i)
        for added in data.get("added_tokens") or []:
            out[added.get("content")] = int(added["id"])
        return out
    files = ("tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")
    if not any((Path(target_dir) / f).is_file() for f in files):  # transformers would build an empty one
        raise ValueError(f"no tokenizer in {target_dir} (none of tokenizer.json, {', '.join(files)})")
    try:
        from transformers import AutoTokenizer

        return dict(AutoTokenizer.from_pretrained(target_dir).get_vocab())
    except Exception as exc:  # noqa: BLE001 - any loader failure means "no readable tokenizer"
        raise ValueError(f"cannot load a tokenizer from {target_dir}: {exc}") from None


def lookup_token_id(target_dir: str | os.PathLike[str], token: str) -> int | None:
    """Id of the exact token string ``token`` in the target's tokenizer, or None if it is not a single token
    (:func:`read_tokenizer_vocab`; raises ValueError when no tokenizer can be read)."""
    return read_tokenizer_vocab(target_dir).get(token)


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (safetensors dtype tag, shape) from a .safetensors file header, without loading data.

    Raises:
        ValueError: unreadable file, bad header length/JSON, or a tensor whose data range lies beyond the end of
            the file (a truncated file).
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise ValueError("file shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", raw)
            if n > min(size - 8, 100 << 20):
                raise ValueError(f"header length {n} exceeds the file size {size}")
            header = json.loads(fh.read(n))
    except OSError as exc:
        raise ValueError(f"cannot read {p}: {exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{p}: header is not JSON: {exc}") from None
    data_len = size - 8 - n
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{p}: malformed header entry for {name!r}") from None
        if not 0 <= begin <= end <= data_len:
            raise ValueError(f"{p}: tensor {name!r} data [{begin}, {end}) lies beyond the file's {data_len} "
                             "data bytes (truncated file?)")
        out[name] = (dtype, shape)
    return out
