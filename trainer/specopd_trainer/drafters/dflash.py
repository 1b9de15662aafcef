"""The trainable DFlash drafter: SGLang 0.5.23's ``DFlashDraftModel`` (``sglang/srt/models/dflash.py``) in torch.

``state_dict()`` keys and shapes are exactly :func:`sglang_specopd.wire.drafters.format.expected_tensors` (the
checkpoint SGLang loads); the target's embedding and LM head live in a :class:`TargetHead` of non-persistent
buffers. Data flow (worker ``sglang/srt/speculative/dflash_worker_v2.py``):

* context: target hidden states at ``target_layer_ids`` (HF ``hidden_states[id + 1]``, concatenated in id
  order) ``[T, K*H]`` -> ``hidden_norm(fc(.))`` -> per layer ``k_norm(k_proj(.))`` + RoPE at the context
  positions, ``v_proj(.)`` (``_append_target_hidden_to_draft_kv_by_loc``; no input_layernorm on the context);
* block: target embedding of ``[anchor token, MASK x (B-1)]`` at positions ``anchor .. anchor+B-1``, through the
  draft layers (non-causal in the block, seeing the context positions < anchor), then the draft ``norm``;
* proposals: ``argmax(hidden @ lm_head.T)`` for slots 1..B-1 (no target final norm). Plain DFLASH proposes the
  argmax at any sampling temperature (verification then treats the draft as a point mass).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from sglang_specopd.wire.drafters.format import DrafterSpec, read_drafter_config
from specopd_trainer.drafters.blocks import DrafterInputError, build_dflash_training_mask, make_blocks
from specopd_trainer.drafters.layers import DFlashDecoderLayer, RMSNorm, rope_cos_sin
from specopd_trainer.drafters.registry import register_drafter
from specopd_trainer.drafters.target_head import TargetHead, load_target_head

KV = list[tuple[torch.Tensor, torch.Tensor]]


class DrafterLoadError(ValueError):
    """A drafter checkpoint whose tensors do not match its config (missing/unexpected names, wrong shapes)."""


class MissingTargetHeadError(RuntimeError):
    """An operation needing the target's embedding / LM head was called before ``load_target_head``."""


@register_drafter("dflash")
class DFlashDrafter(nn.Module):
    """DFlash drafter built from a :class:`DrafterSpec`; fresh weights equal ``init_drafter_tensors(spec, seed)``.

    Parameters are fp32 unless ``dtype`` is given; ``save_pretrained`` casts to ``spec.dtype``. Subclasses (the
    DFlash V2 and DSpark drafters) override :meth:`_make_layer` / :meth:`_build_heads` to add their modules;
    checkpoints are read and written through the class's registered architecture entry (``drafter_arch``).
    """

    drafter_name = "dflash"

    def __init__(self, spec: DrafterSpec, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 target_head: Optional[TargetHead] = None):
        super().__init__()
        if not spec.plain_attention:  # SGLang serves these (and specopd pushes them); their training is not here
            raise DrafterLoadError(f"specopd trains DFlash's non-causal full attention only; this drafter has "
                                   f"layer_types {list(spec.layer_types)}, sliding_window {spec.sliding_window}, "
                                   f"is_causal {spec.is_causal}")
        self.spec = spec
        h, eps = spec.hidden_size, spec.rms_norm_eps
        self.layers = nn.ModuleList(self._make_layer(spec) for _ in range(spec.num_hidden_layers))
        self.fc = nn.Linear(spec.num_context_features * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, eps)
        self.norm = RMSNorm(h, eps)
        self._build_heads(spec)
        from sglang_specopd.wire.drafters.init import init_drafter_tensors

        self.load_state_dict(init_drafter_tensors(spec, seed), strict=True)
        self.to(dtype)
        self.target_head = target_head

    @staticmethod
    def _make_layer(spec: DrafterSpec) -> nn.Module:
        """One draft layer (module names = checkpoint names under ``layers.{i}.``)."""
        return DFlashDecoderLayer(spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads,
                                  spec.head_dim, spec.intermediate_size, spec.rms_norm_eps, spec.rope_theta)

    def _build_heads(self, spec: DrafterSpec) -> None:
        """Modules after the backbone (none for DFlash)."""

    # ---- shapes and helpers -------------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.spec.block_size

    def _head(self) -> TargetHead:
        if self.target_head is None:
            raise MissingTargetHeadError("no target embedding/LM head: call load_target_head(target_dir) or pass "
                                         "target_head=")
        return self.target_head

    def _device(self) -> torch.device:
        return self.fc.weight.device

    def load_target_head(self, target_dir: str | os.PathLike[str]) -> TargetHead:
        """Load only the target's embedding and LM head (see :func:`load_target_head`), in this drafter's dtype
        and device; verify its shape fits ``spec`` (raises DrafterLoadError otherwise)."""
        head = load_target_head(target_dir, dtype=self.fc.weight.dtype).to(self._device())
        if head.vocab_size != self.spec.vocab_size or head.hidden_size != self.spec.hidden_size:
            raise DrafterLoadError(f"target head [{head.vocab_size}, {head.hidden_size}] does not fit the drafter "
                                   f"spec (vocab_size {self.spec.vocab_size}, hidden_size {self.spec.hidden_size})")
        self.target_head = head
        return head

    # ---- forward pieces -----------------------------------------------------------------------------------
    def project_context(self, ctx_features: torch.Tensor) -> torch.Tensor:
        """``[T, K*H]`` target features -> ``[T, H]`` = hidden_norm(fc(x)) (``project_target_hidden``).

        Raises DrafterInputError when the feature width is not K*H."""
        want = self.fc.in_features
        if ctx_features.ndim != 2 or ctx_features.shape[1] != want:
            raise DrafterInputError(f"context features must be [T, {want}] (K={self.spec.num_context_features} "
                                    f"target layers x hidden {self.spec.hidden_size}), got {tuple(ctx_features.shape)}")
        return self.hidden_norm(self.fc(ctx_features.to(self.fc.weight.device, self.fc.weight.dtype)))

    def context_kv(self, ctx_features: torch.Tensor, positions: torch.Tensor) -> KV:
        """Per draft layer ``(K, V)``, each ``[T, kv_heads, head_dim]``, for features ``[T, K*H]`` at long
        ``positions [T]`` (RoPE applied to K), as SGLang writes them into the draft KV cache."""
        ctx = self.project_context(ctx_features)
        positions = positions.to(ctx.device)
        if positions.shape != (ctx.shape[0],):
            raise DrafterInputError(f"positions must be [{ctx.shape[0]}], got {tuple(positions.shape)}")
        cos, sin = rope_cos_sin(positions, self.spec.head_dim, self.spec.rope_theta)
        return [layer.self_attn.context_kv(ctx, cos, sin) for layer in self.layers]

    def forward_hidden(self, block_ids: torch.Tensor, block_positions: torch.Tensor, ctx_kv: KV,
                       mask: Optional[torch.Tensor], rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Draft hidden states ``[N, H]`` (after the final ``norm``) for ``N`` flattened block tokens.

        Args: block_ids / block_positions long [N]; ctx_kv from :meth:`context_kv` (T rows); mask bool
        [N, T + N] (True = attend) or None (every query sees every key); rows: optional long [M], the rows
        wanted (returns ``[M, H]``; the last layer queries and runs its MLP on those rows only, which is exact:
        no later layer reads the other rows)."""
        x = self._head().embed_tokens(block_ids.to(self._device())).to(self.fc.weight.dtype)
        cos, sin = rope_cos_sin(block_positions.to(x.device), self.spec.head_dim, self.spec.rope_theta)
        last = len(self.layers) - 1
        for i, (layer, (k, v)) in enumerate(zip(self.layers, ctx_kv)):
            x = layer(x, cos, sin, k, v, mask, rows if i == last else None)
        return self.norm(x)

    def forward_blocks(self, ctx_features: torch.Tensor, block_input_ids: torch.Tensor,
                       block_positions: torch.Tensor, anchors: torch.Tensor,
                       slots: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Training forward of ``nB`` blocks of ONE sequence: hidden ``[nB, B, H]``, or ``[M, H]`` for ``slots``.

        ``ctx_features [T, K*H]`` are the target features of positions 0..T-1; block ``b`` sees context
        positions ``< anchors[b]`` and its own block (:func:`build_dflash_training_mask`). ``slots``: optional
        bool ``[nB, B]``, the slots whose hidden states are wanted, returned block-major as ``[M, H]``
        (``forward_blocks(...)[slots]``, computed with the last layer on those rows only: a SpecOPD root anchor
        needs slot 1 of its block, so its other 7 rows skip the last layer)."""
        nb, b = block_input_ids.shape
        if b != self.block_size or block_positions.shape != block_input_ids.shape or anchors.shape != (nb,):
            raise DrafterInputError(f"blocks must be [nB, {self.block_size}] with anchors [nB]; got ids "
                                    f"{tuple(block_input_ids.shape)}, positions {tuple(block_positions.shape)}, "
                                    f"anchors {tuple(anchors.shape)}")
        if slots is not None and (slots.shape != (nb, b) or slots.dtype != torch.bool):
            raise DrafterInputError(f"slots must be bool [{nb}, {b}], got {slots.dtype} {tuple(slots.shape)}")
        t = ctx_features.shape[0]
        kv = self.context_kv(ctx_features, torch.arange(t))
        mask = build_dflash_training_mask(t, anchors.cpu(), b).to(self._device())
        rows = None if slots is None else slots.reshape(-1).nonzero().squeeze(1).to(self._device())
        hidden = self.forward_hidden(block_input_ids.reshape(-1), block_positions.reshape(-1), kv, mask, rows)
        return hidden.view(nb, b, -1) if slots is None else hidden

    def logits(self, ctx_features: torch.Tensor, token_ids: torch.Tensor,
               anchors: torch.Tensor | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Training logits at ``anchors`` of one sequence ``token_ids [L]`` with features ``[L, K*H]``.

        Returns ``(logits [nB, B, V] in the head dtype, labels [nB, B])`` (labels from :func:`make_blocks`:
        slot 0 and positions past the end are -100)."""
        hidden, labels = self.block_hidden(ctx_features, token_ids, anchors)
        return self._head().logits(hidden), labels

    def block_hidden(self, ctx_features: torch.Tensor, token_ids: torch.Tensor,
                     anchors: torch.Tensor | Sequence[int], slots: Optional[torch.Tensor] = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`logits` before the vocabulary head: ``(hidden [nB, B, H], labels [nB, B])``, for callers that
        need the head on some slots only (the head dominates the drafter's cost). With ``slots`` (bool
        ``[nB, B]``) hidden is ``[M, H]``, the selected slots in block-major order (:meth:`forward_blocks`)."""
        blocks = make_blocks(token_ids.cpu(), anchors, self.block_size, self.spec.mask_token_id)
        hidden = self.forward_blocks(ctx_features, blocks.input_ids, blocks.positions, blocks.anchors, slots)
        return hidden, blocks.labels.to(hidden.device)

    def slot_q(self, ctx_features: torch.Tensor, token_ids: torch.Tensor, anchors: torch.Tensor,
               roots: Optional[torch.Tensor] = None, head: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        """The drafter's q at ``anchors [A]`` (slots 1..G) and at ``roots [R]`` (slot 1 only) of one sequence: an
        :class:`~specopd_trainer.drafters.slot_q.IndependentSlotQ` (every architecture has ``slot_q``; see
        :mod:`specopd_trainer.drafters.slot_q`). One forward over all A + R blocks whose last layer and vocabulary
        head run on the slots used only; ``head`` maps hidden ``[..., H]`` to logits ``[..., V]`` (default the
        target head's ``logits``; e.g. a cached bf16 head). Logits come back fp32 with their graph."""
        from specopd_trainer.drafters.slot_q import IndependentSlotQ

        anchors = torch.as_tensor(anchors, dtype=torch.long)
        roots = anchors[:0] if roots is None else torch.as_tensor(roots, dtype=torch.long)
        a_n, r_n, b = anchors.numel(), roots.numel(), self.block_size
        slots = torch.zeros(a_n + r_n, b, dtype=torch.bool)
        slots[:a_n, 1:] = True
        slots[a_n:, 1] = True
        hidden, _ = self.block_hidden(ctx_features, token_ids, torch.cat([anchors, roots]), slots)
        head = head or self._head().logits
        return IndependentSlotQ(head(hidden[: a_n * (b - 1)].view(a_n, b - 1, -1)).float(),
                                head(hidden[a_n * (b - 1):]).float())

    # ---- proposals ----------------------------------------------------------------------------------------
    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> torch.Tensor:
        if temperature <= 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(probs.shape[:-1])

    @torch.no_grad()
    def propose(self, ctx_features: torch.Tensor, anchor_token: int, anchor_pos: int, temperature: float = 0.0,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """The ``B-1`` drafted token ids (long [B-1]) for the block at ``anchor_pos``, exactly as SGLang serves it.

        Args:
            ctx_features: ``[anchor_pos, K*H]`` target features of positions ``0 .. anchor_pos-1``.
            anchor_token: the token at ``anchor_pos`` (the last verified token).
            anchor_pos: the anchor position (a trace record's ``"anchor"``).
            temperature: 0 = argmax per slot (SGLang DFLASH); > 0 samples each slot independently.
        Raises DrafterInputError if ``ctx_features`` does not have exactly ``anchor_pos`` rows."""
        if ctx_features.ndim != 2 or ctx_features.shape[0] != anchor_pos:
            raise DrafterInputError(f"propose needs features for positions 0..{anchor_pos - 1}: "
                                    f"[{anchor_pos}, K*H], got {tuple(ctx_features.shape)}")
        kv = self.context_kv(ctx_features, torch.arange(anchor_pos))
        ids = torch.full((self.block_size,), self.spec.mask_token_id, dtype=torch.long)
        ids[0] = int(anchor_token)
        hidden = self.forward_hidden(ids, anchor_pos + torch.arange(self.block_size), kv, None)
        return self._pick(self._head().logits(hidden[1:]), temperature, generator).cpu()

    @torch.no_grad()
    def propose_blocks(self, ctx_features: torch.Tensor, token_ids: torch.Tensor,
                       anchors: torch.Tensor | Sequence[int], temperature: float = 0.0,
                       generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Proposals ``[nB, B-1]`` at many anchors of one sequence in one forward (training mask)."""
        logits, _ = self.logits(ctx_features, token_ids, anchors)
        return self._pick(logits[:, 1:], temperature, generator).cpu()

    # ---- checkpoints --------------------------------------------------------------------------------------
    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """``state_dict`` detached on CPU in ``spec.dtype``: exactly the SGLang checkpoint tensors."""
        dtype = getattr(torch, self.spec.dtype)
        return {n: t.detach().to("cpu", dtype).contiguous() for n, t in self.state_dict().items()}

    def checkpoint_config(self) -> dict:
        """The config.json dict of this drafter (its architecture entry's ``config(spec)``)."""
        return self.drafter_arch.config(self.spec)

    def save_pretrained(self, out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Atomically write ``config.json`` + ``model.safetensors`` (via ``sglang_specopd.wire.drafters.init.save_drafter``).
        Raises DrafterInitError if ``out_dir`` exists and not ``overwrite``."""
        from sglang_specopd.wire.drafters.init import save_drafter

        return save_drafter(self.spec, self.checkpoint_tensors(), out_dir, overwrite=overwrite)

    @classmethod
    def from_pretrained(cls, drafter_dir: str | os.PathLike[str], target_dir: str | os.PathLike[str] | None = None,
                        *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> "DFlashDrafter":
        """Load a drafter checkpoint (and, if ``target_dir`` is given, the target's embedding + LM head).

        Raises: DrafterConfigError (bad config.json, or one of another architecture), DrafterLoadError (tensor
        names/shapes differ from the spec, or no model.safetensors)."""
        from safetensors.torch import load_file

        arch = cls.drafter_arch
        spec = arch.parse_config(read_drafter_config(drafter_dir))
        path = Path(drafter_dir) / "model.safetensors"
        if not path.is_file():
            raise DrafterLoadError(f"{path} does not exist")
        tensors = load_file(str(path))
        want = arch.expected_tensors(spec)
        problems = [f"missing {n}" for n in want if n not in tensors]
        problems += [f"unexpected {n}" for n in tensors if n not in want]
        problems += [f"{n}: shape {tuple(t.shape)} != {want[n]}" for n, t in tensors.items()
                     if n in want and tuple(t.shape) != want[n]]
        if problems:
            raise DrafterLoadError(f"{path}: tensors do not match config.json: " + "; ".join(problems[:10]))
        model = cls(spec, dtype=dtype)
        model.load_state_dict({n: t.to(dtype) for n, t in tensors.items()}, strict=True)
        model.to(device)
        if target_dir is not None:
            model.load_target_head(target_dir)
        return model
