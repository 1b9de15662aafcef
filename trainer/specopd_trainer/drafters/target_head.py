"""The target's frozen token embedding and LM head, which DFlash drafters borrow (never the full target).

SGLang (``speculative/dflash_worker_v2.py``): the block ``[anchor, MASK x (B-1)]`` is embedded with the
TARGET's input embedding (``target_model.get_input_embeddings()``; scale 1 unless the target defines
``get_dflash_noise_embedding_scale``, which no SGLang 0.5.23 model does), and draft tokens are
``argmax(draft_hidden @ lm_head.weight.T)`` over slots 1..B-1 (``_greedy_sample_from_vocab_parallel_head``).
The draft hidden already went through the DRAFT's own final ``norm`` (``DFlashDraftModel.forward``); the
target's final norm is NOT applied, so it is not loaded here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "model.language_model.embed_tokens.weight")
HEAD_NAMES = ("lm_head.weight", "model.lm_head.weight")


class TargetHeadError(ValueError):
    """The target checkpoint lacks readable embedding / LM-head tensors, or their shapes disagree."""


class TargetHead(nn.Module):
    """Frozen ``embed [V, H]`` and ``lm_head [V, H]`` held as NON-persistent buffers (absent from state_dict,
    moved by ``.to()``, never returned by ``parameters()``). Tied targets share one tensor."""

    def __init__(self, embed: torch.Tensor, lm_head: torch.Tensor):
        super().__init__()
        if embed.ndim != 2 or tuple(embed.shape) != tuple(lm_head.shape):
            raise TargetHeadError(f"embedding {tuple(embed.shape)} and lm_head {tuple(lm_head.shape)} must both be "
                                  "[vocab, hidden]")
        self.register_buffer("embed", embed.detach(), persistent=False)
        self.register_buffer("lm_head", lm_head.detach(), persistent=False)

    @property
    def vocab_size(self) -> int:
        return int(self.embed.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.embed.shape[1])

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` long [...] -> embeddings [..., H] (buffer dtype)."""
        return self.embed[ids]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [..., H]`` -> logits ``[..., V]`` = hidden @ lm_head.T, in the head's dtype (as SGLang)."""
        return flat_matmul_t(hidden.to(self.lm_head.dtype), self.lm_head)


def flat_matmul_t(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [..., H] @ w[V, H].T`` as ONE 2-D matmul: ``[..., V]``.

    ``@`` (and ``F.linear``) on a non-contiguous ``[..., H]`` view, such as the slot slice ``hidden[:, 1:]`` of
    drafter blocks, broadcasts the ``[V, H]`` weight into a batched matmul instead: measured 4.5x slower forward
    and backward (475 vs 106 ms) for 16 x 7 rows x 49k on one CPU thread. Flattening copies only the small ``x``."""
    return (x.reshape(-1, x.shape[-1]) @ w.T).view(*x.shape[:-1], w.shape[0])


def _weight_files(target_dir: Path) -> dict[str, Path]:
    index = target_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TargetHeadError(f"{index} is not a valid safetensors index: {exc}") from None
        return {name: target_dir / fname for name, fname in weight_map.items()}
    single = target_dir / "model.safetensors"
    if not single.is_file():
        raise TargetHeadError(f"no model.safetensors or model.safetensors.index.json in {target_dir}")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as fh:
        return {name: single for name in fh.keys()}


def _read(name: str, path: Path) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return fh.get_tensor(name)


def load_target_head(target_dir: str | os.PathLike[str], dtype: torch.dtype | None = None) -> TargetHead:
    """Read only the embedding and LM head of the HF target at ``target_dir`` (safetensors, single or sharded).

    A missing ``lm_head.weight`` (or ``tie_word_embeddings: true``) means tied: the embedding is used for both.
    ``dtype`` casts both (default: as stored).

    Raises:
        TargetHeadError: no safetensors, no embedding tensor, or a head whose shape differs from the embedding.
    """
    root = Path(target_dir).expanduser()
    try:
        cfg = json.loads((root / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise TargetHeadError(f"cannot read {root / 'config.json'}: {exc}") from None
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    tied = bool(text_cfg.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)))
    files = _weight_files(root)
    embed_name = next((n for n in EMBED_NAMES if n in files), None)
    if embed_name is None:
        raise TargetHeadError(f"{root}: no embedding tensor (looked for {', '.join(EMBED_NAMES)})")
    embed = _read(embed_name, files[embed_name])
    head_name = next((n for n in HEAD_NAMES if n in files), None)
    head = embed if (tied or head_name is None) else _read(head_name, files[head_name])
    if dtype is not None:
        shared = head is embed
        embed = embed.to(dtype)
        head = embed if shared else head.to(dtype)
    return TargetHead(embed, head)
