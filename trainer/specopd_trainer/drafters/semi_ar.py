"""Base of the semi-autoregressive drafters (DFlash V2, DSpark): a slot's q depends on the tokens drafted before it.

The backbone is DFlash's (:class:`~specopd_trainer.drafters.dflash.DFlashDrafter`): one non-causal forward of the
block gives a hidden state per slot. What differs is the head on top: slot ``k``'s distribution is
``q_k(y | y_1 .. y_{k-1}, context)``, so a block is drawn left to right from the verified anchor, and a branch's
probability is the product of its own conditionals. Slot conventions (specopd's): ``block_size`` = B is the
verify block (anchor + B-1 drafted tokens); slot ``k`` = 1..B-1 drafts the token at ``anchor + k``; tensors over
the drafted slots have ``S = B-1`` columns (column ``k-1`` = slot ``k``). Subclasses set how many query rows the
forward has (``num_query_rows``) and which row feeds slot 1 (``first_slot_row``): 1 for DFlash V2 (rows
``[anchor, MASK x (B-1)]``, row k -> slot k), 0 for DSpark's anchor-first convention (rows ``[anchor, MASK x
(B-2)]``, row k-1 -> slot k).

Subclasses implement :meth:`conditional_logits`, :meth:`branch_log_probs`, :meth:`sample_branches` and its split
into :meth:`unary_logits` + :meth:`path_bias`; this module gives the block forwards (:meth:`slot_hidden`, training
mask; :meth:`serve_slot_hidden`, one served block), teacher-forced training logits in the DFlash layout
(:meth:`logits`, SFT), proposals, and :meth:`slot_q`, the conditional q that SpecOPD / Draft-OPD sample branches
from and train through proposal trees (:mod:`specopd_trainer.drafters.slot_q`).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from specopd_trainer.drafters.blocks import DrafterInputError, build_dflash_training_mask, make_blocks
from specopd_trainer.drafters.conv import ConvDecoderLayer
from specopd_trainer.drafters.dflash import KV, DFlashDrafter
from specopd_trainer.drafters.layers import rope_cos_sin


def draw_inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index drawn from each row of ``probs [M, K]`` (fp32, rows sum to 1) by inverse CDF with ``uniforms [M]`` in
    [0, 1): ``#{j : u >= cumsum(p)_j}``, clamped to K-1. This is SGLang 0.5.23's CPU walk
    (``CandidateSelector.sample_path``), so equal uniforms give SGLang's draw. Returns long ``[M]``."""
    return uniforms[:, None].ge(probs.cumsum(dim=-1)).sum(dim=-1).clamp_max(probs.shape[-1] - 1)


def pick_slot(scores: torch.Tensor, temperature: float, uniforms: Optional[torch.Tensor]
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """One left-to-right step: the index chosen in each row of ``scores [M, K]`` (fp32) and its log q, both ``[M]``.
    ``uniforms`` None (temperature 0): argmax, log q = 0 (a point mass); else an inverse-CDF draw
    (:func:`draw_inverse_cdf`) from ``softmax(scores / temperature)`` with ``uniforms [M]``."""
    if uniforms is None:
        return scores.argmax(dim=-1), torch.zeros(scores.shape[0], device=scores.device)
    probs = torch.softmax(scores / temperature, dim=-1)
    index = draw_inverse_cdf(probs, uniforms)
    return index, probs.gather(1, index[:, None])[:, 0].log()


def previous_tokens(anchor_tokens: torch.Tensor, branch_tokens: torch.Tensor) -> torch.Tensor:
    """The token before each slot: ``[anchor, y_1 .. y_{S-1}]`` as long ``[M, S]`` for ``anchor [M]``,
    ``branch [M, S]``."""
    return torch.cat([anchor_tokens.view(-1, 1), branch_tokens[:, :-1]], dim=1).long()


def path_previous(anchor_tokens: torch.Tensor, path: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """The token drafted just before slot ``slot[m]`` (0-based column) of row m: the anchor for slot 0, else
    ``path[m, slot[m] - 1]``. ``anchor [M]``, ``path [M, P]``, ``slot [M]`` long; returns long ``[M]``."""
    before = path.long().gather(1, (slot - 1).clamp(min=0).view(-1, 1))[:, 0]
    return torch.where(slot > 0, before, anchor_tokens.long().to(path.device))


class SemiARDrafter(DFlashDrafter):
    """A DFlash-backbone drafter with a left-to-right head (see the module docstring)."""

    first_slot_row = 1

    @property
    def num_query_rows(self) -> int:
        """Rows of the block forward (B here; DSpark anchor-first: B-1)."""
        return self.block_size

    @property
    def num_slots(self) -> int:
        """S = B-1 drafted tokens per block."""
        return self.block_size - 1

    # ---- head interface (subclasses) ----------------------------------------------------------------------
    def conditional_logits(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor,
                           branch_tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced per-slot logits ``[M, S, V]`` fp32 of slot k given ``y_<k`` = the branch's own tokens."""
        raise NotImplementedError

    def branch_log_probs(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, branch_tokens: torch.Tensor,
                         temperature: float = 1.0) -> torch.Tensor:
        """``log q_k(y_k | y_<k)`` ``[M, S]`` fp32 of each branch's own tokens, as served at ``temperature`` > 0."""
        raise NotImplementedError

    def sample_branches(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, temperature: float = 0.0,
                        generator: Optional[torch.Generator] = None, uniforms: Optional[torch.Tensor] = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw blocks left to right: ``(tokens [M, S] long, log q [M, S] fp32)``; temperature 0 = greedy walk."""
        raise NotImplementedError

    def unary_logits(self, hidden: torch.Tensor, head: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                     ) -> torch.Tensor:
        """The path-free part of each slot's logits, fp32 ``[..., V]`` for ``hidden [..., H]``; ``head`` replaces
        the target head's ``logits`` (e.g. a bf16 copy). :meth:`conditional_logits` = this + :meth:`path_bias`."""
        raise NotImplementedError

    def path_bias(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, path: torch.Tensor,
                  slot: torch.Tensor) -> torch.Tensor:
        """The path-dependent part of the logits, fp32 ``[M, V]``, of slot ``slot[m]`` (0-based) of row m given
        the tokens ``path[m, :slot[m]]`` drafted before it (later columns ignored). ``hidden [M, S, H]`` (the row's
        block), ``anchor [M]``, ``path [M, P]``, ``slot [M]`` long."""
        raise NotImplementedError

    def slot_q(self, ctx_features: torch.Tensor, token_ids: torch.Tensor, anchors: torch.Tensor,
               roots: Optional[torch.Tensor] = None, head: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        """The conditional q at ``anchors [A]`` (and slot 1 at ``roots [R]``) of one sequence, one forward (the
        training mask): a :class:`~specopd_trainer.drafters.slot_q.ConditionalSlotQ` (branch sampling, greedy
        walk, per-tree-row logits). ``head``: as in :meth:`unary_logits`."""
        from specopd_trainer.drafters.slot_q import ConditionalSlotQ

        anchors = torch.as_tensor(anchors, dtype=torch.long)
        roots = anchors[:0] if roots is None else torch.as_tensor(roots, dtype=torch.long)
        a_n = anchors.numel()
        hidden, _, anchor_tokens = self.slot_hidden(ctx_features, token_ids, torch.cat([anchors, roots]))
        hidden = hidden.to(self.fc.weight.dtype)  # an autocast forward's bf16 rows: path_bias runs outside autocast
        return ConditionalSlotQ(self, hidden[:a_n], anchor_tokens[:a_n], self.unary_logits(hidden[:a_n], head),
                                hidden[a_n:], anchor_tokens[a_n:], self.unary_logits(hidden[a_n:, 0], head))

    @staticmethod
    def _uniforms(m: int, s: int, uniforms: Optional[torch.Tensor], generator: Optional[torch.Generator],
                  device: torch.device) -> torch.Tensor:
        if uniforms is None:
            return torch.rand(m, s, generator=generator).to(device)
        if uniforms.shape != (m, s):
            raise DrafterInputError(f"uniforms must be [{m}, {s}], got {tuple(uniforms.shape)}")
        return uniforms.to(device, torch.float32)

    # ---- backbone -----------------------------------------------------------------------------------------
    def forward_hidden(self, block_ids: torch.Tensor, block_positions: torch.Tensor, ctx_kv: KV,
                       mask: Optional[torch.Tensor], rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Draft hidden ``[N, H]`` (after ``norm``) of ``N`` block-major rows in blocks of ``num_query_rows``
        (conv layers need whole blocks, so ``rows`` selects after the full forward)."""
        x = self._head().embed_tokens(block_ids.to(self._device())).to(self.fc.weight.dtype)
        cos, sin = rope_cos_sin(block_positions.to(x.device), self.spec.head_dim, self.spec.rope_theta)
        q = self.num_query_rows
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask, block_len=q) if isinstance(layer, ConvDecoderLayer) \
                else layer(x, cos, sin, k, v, mask)
        x = self.norm(x)
        return x if rows is None else x[rows]

    def slot_hidden(self, ctx_features: torch.Tensor, token_ids: torch.Tensor,
                    anchors: torch.Tensor | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training forward of ``nB`` blocks of ONE sequence ``token_ids [L]`` with features ``[L, K*H]``.

        Returns ``(hidden [nB, S, H], labels [nB, S], anchor_tokens [nB])``: the hidden state feeding each drafted
        slot, the true tokens at ``anchor + 1 .. anchor + S`` (-100 past the end) and the anchor tokens. Block b
        sees context positions ``< anchors[b]`` and its own rows (the DFlash training mask)."""
        blocks = make_blocks(token_ids.cpu(), anchors, self.block_size, self.spec.mask_token_id)
        q, s, t = self.num_query_rows, self.num_slots, ctx_features.shape[0]
        kv = self.context_kv(ctx_features, torch.arange(t))
        mask = build_dflash_training_mask(t, blocks.anchors, q).to(self._device())
        hidden = self.forward_hidden(blocks.input_ids[:, :q].reshape(-1), blocks.positions[:, :q].reshape(-1), kv,
                                     mask)
        hidden = hidden.view(blocks.anchors.numel(), q, -1)[:, self.first_slot_row:self.first_slot_row + s]
        dev = hidden.device
        return hidden, blocks.labels[:, 1:].to(dev), blocks.input_ids[:, 0].to(dev)

    def serve_slot_hidden(self, ctx_features: torch.Tensor, anchor_token: int, anchor_pos: int) -> torch.Tensor:
        """Slot hidden ``[1, S, H]`` of the block SGLang runs at ``anchor_pos`` (features ``[anchor_pos, K*H]`` of
        positions 0..anchor_pos-1). Raises DrafterInputError for a feature count other than ``anchor_pos``."""
        if ctx_features.ndim != 2 or ctx_features.shape[0] != anchor_pos:
            raise DrafterInputError(f"a served block needs features for positions 0..{anchor_pos - 1}: "
                                    f"[{anchor_pos}, K*H], got {tuple(ctx_features.shape)}")
        q = self.num_query_rows
        kv = self.context_kv(ctx_features, torch.arange(anchor_pos))
        ids = torch.full((q,), self.spec.mask_token_id, dtype=torch.long)
        ids[0] = int(anchor_token)
        hidden = self.forward_hidden(ids, anchor_pos + torch.arange(q), kv, None)
        return hidden[self.first_slot_row:self.first_slot_row + self.num_slots].unsqueeze(0)

    def forward_blocks(self, *args, **kwargs) -> torch.Tensor:
        """Refused: the rows differ from DFlash's and a slot's distribution is not ``target_head.logits`` of its
        hidden state. Use :meth:`slot_hidden` with :meth:`conditional_logits`. Raises NotImplementedError."""
        raise NotImplementedError(f"{type(self).__name__}: slots are not independent; use slot_q (training over "
                                  "proposal trees) or slot_hidden and conditional_logits / branch_log_probs")

    block_hidden = forward_blocks  # DFlash's per-slot hidden -> target head would be wrong here: use slot_q

    # ---- DFlash-compatible training interface -------------------------------------------------------------
    def logits(self, ctx_features: torch.Tensor, token_ids: torch.Tensor,
               anchors: torch.Tensor | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced training logits in the DFlash layout: ``(logits [nB, B, V] fp32, labels [nB, B])``; slot
        k's logits are :meth:`conditional_logits` given the sequence's own tokens before it (slot 0 is zero and
        its label -100, as are slots past the end; their teacher token is the mask token)."""
        hidden, labels, anchor_tokens = self.slot_hidden(ctx_features, token_ids, anchors)
        teacher = torch.where(labels >= 0, labels, torch.full_like(labels, self.spec.mask_token_id))
        cond = self.conditional_logits(hidden, anchor_tokens, teacher)
        logits = torch.cat([torch.zeros_like(cond[:, :1]), cond], dim=1)
        return logits, torch.cat([torch.full_like(labels[:, :1], -100), labels], dim=1)

    @torch.no_grad()
    def propose(self, ctx_features: torch.Tensor, anchor_token: int, anchor_pos: int, temperature: float = 0.0,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """The ``B-1`` drafted token ids (long [B-1], CPU) for the block at ``anchor_pos``, drawn left to right as
        SGLang does (temperature 0: the greedy walk). Raises DrafterInputError (feature rows != anchor_pos)."""
        hidden = self.serve_slot_hidden(ctx_features, anchor_token, anchor_pos)
        anchor = torch.tensor([int(anchor_token)], device=hidden.device)
        return self.sample_branches(hidden, anchor, temperature, generator)[0][0].cpu()

    @torch.no_grad()
    def propose_blocks(self, ctx_features: torch.Tensor, token_ids: torch.Tensor,
                       anchors: torch.Tensor | Sequence[int], temperature: float = 0.0,
                       generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Proposals ``[nB, B-1]`` (CPU) at many anchors of one sequence in one forward (training mask)."""
        hidden, _, anchor_tokens = self.slot_hidden(ctx_features, token_ids, anchors)
        return self.sample_branches(hidden, anchor_tokens, temperature, generator)[0].cpu()
