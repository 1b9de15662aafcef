"""The drafter's q at branch anchors, for every drafter architecture: what SpecOPD, Draft-OPD and sequential OPD
sample branches from and train through proposal trees.

``drafter.slot_q(ctx_features, token_ids, anchors, roots, head)`` runs ONE drafter forward at the anchors of a
sequence and returns an object with the same four operations whatever the architecture:

* ``sample(k, temperature, generator)``: ``k`` branches per anchor, long ``[A, k, G]`` (G = B-1 drafted slots),
  drawn from q at ``temperature``;
* ``greedy()``: the temperature-0 block per anchor, long ``[A, G]``;
* ``tree_logits(row_anchor, row_slot, row_path)``: ``(draft_logits [Q, V], row_draft [R])`` for the R rows of
  proposal trees at these anchors, the form every tree loss of :mod:`specopd_kernels.losses` takes: the q that
  row r is compared with is ``softmax(draft_logits[row_draft[r]])``;
* ``root_logits``: slot-1 logits ``[R_root, V]`` at root anchors (slot 1 depends on the anchor only).

Two implementations:

* :class:`IndependentSlotQ` (DFlash): every slot of a block is drafted in parallel, so slot i's q does not depend on
  the tokens sampled at slots < i. ``draft_logits`` are the ``[A*G, V]`` slot logits and ``row_draft = anchor * G +
  slot``: every tree row at (anchor, slot) shares one q row. Branches draw every slot independently.
* :class:`ConditionalSlotQ` (DFlash V2, DSpark: :class:`~specopd_trainer.drafters.semi_ar.SemiARDrafter`): slot k's
  q is ``q_k(. | y_1 .. y_{k-1})``, so each tree row gets its OWN q row, conditioned on the tokens on its path from
  the anchor (``row_path``): ``draft_logits [R, V]``, ``row_draft = arange(R)``. Logits are
  ``unary[anchor, slot] + drafter.path_bias(...)`` (the slot's path-free part once per (anchor, slot), the low-rank
  path term per row). Branches are drawn slot by slot from these conditionals (the left-to-right walk).

A branch's probability is then ``prod_k q_k(y_k | y_<k)`` under both, which is what makes the E2E-TV surrogate's
``prod alpha`` an on-policy estimate of P(accept >= j) (SpecOPD; ``../shared/notes/algorithms.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


def _check_rows(row_anchor: torch.Tensor, row_slot: torch.Tensor, num_anchors: int, num_slots: int) -> None:
    if row_anchor.shape != row_slot.shape or row_anchor.dim() != 1:
        raise ValueError(f"row_anchor and row_slot must be equal 1-D, got {tuple(row_anchor.shape)} and "
                         f"{tuple(row_slot.shape)}")
    if row_anchor.numel() and (int(row_anchor.min()) < 0 or int(row_anchor.max()) >= num_anchors
                               or int(row_slot.min()) < 0 or int(row_slot.max()) >= num_slots):
        raise ValueError(f"rows must have anchors in [0, {num_anchors}) and slots in [0, {num_slots})")


@dataclass
class IndependentSlotQ:
    """DFlash's q: ``logits`` fp32 ``[A, G, V]`` (slot i of anchor a, with graph) and ``root`` fp32 ``[R_root, V]``."""

    logits: torch.Tensor
    root: torch.Tensor

    @property
    def root_logits(self) -> torch.Tensor:
        return self.root

    def sample(self, k: int, temperature: float, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``k`` branches per anchor, each slot drawn independently from ``softmax(logits / T)``: long
        ``[A, k, G]`` (T <= 0: the argmax block, repeated)."""
        if temperature <= 0:
            return self.greedy()[:, None].expand(-1, k, -1).clone()
        probs = torch.softmax(self.logits.detach().float() / temperature, dim=-1)  # [A, G, V]
        a, g, v = probs.shape
        draws = torch.multinomial(probs.reshape(a * g, v), k, replacement=True, generator=generator)  # [A*G, k]
        return draws.view(a, g, k).permute(0, 2, 1).contiguous()

    def take(self, lo: int, hi: int) -> "IndependentSlotQ":
        """Anchors ``lo .. hi-1`` only (same roots)."""
        return IndependentSlotQ(self.logits[lo:hi], self.root)

    def greedy(self) -> torch.Tensor:
        """The argmax of every slot: long ``[A, G]``."""
        return self.logits.detach().argmax(dim=-1)

    def tree_logits(self, row_anchor: torch.Tensor, row_slot: torch.Tensor,
                    row_path: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [A*G, V], row_draft = row_anchor * G + row_slot [R])``; ``row_path`` is not needed (slots are
        independent). Raises ValueError for rows outside the anchors / slots."""
        a, g, v = self.logits.shape
        _check_rows(row_anchor, row_slot, a, g)
        return self.logits.reshape(a * g, v), row_anchor * g + row_slot


@dataclass
class ConditionalSlotQ:
    """A semi-autoregressive drafter's q at ``A`` anchors.

    drafter: the :class:`~specopd_trainer.drafters.semi_ar.SemiARDrafter` (its ``path_bias``). hidden: ``[A, S, H]``
    slot hidden states (S = G = B-1), with graph; anchor_tokens: long ``[A]``; unary: fp32 ``[A, S, V]`` the
    path-free part of each slot's logits; root_hidden / root_anchor_tokens / root_unary: the same at root anchors
    (``[R_root, S, H]``, ``[R_root]``, slot 1 only ``[R_root, V]``).
    """

    drafter: object
    hidden: torch.Tensor
    anchor_tokens: torch.Tensor
    unary: torch.Tensor
    root_hidden: torch.Tensor
    root_anchor_tokens: torch.Tensor
    root_unary: torch.Tensor

    @property
    def root_logits(self) -> torch.Tensor:
        """Slot-1 logits ``[R_root, V]`` fp32 at the root anchors (conditioned on the anchor token only)."""
        n = self.root_hidden.shape[0]
        zero = torch.zeros(n, dtype=torch.long, device=self.root_hidden.device)
        if n == 0:
            return self.root_unary
        return self.root_unary + self.drafter.path_bias(self.root_hidden, self.root_anchor_tokens,
                                                        zero[:, None], zero)

    def row_logits(self, row_anchor: torch.Tensor, row_slot: torch.Tensor, row_path: torch.Tensor) -> torch.Tensor:
        """Conditional logits ``[R, V]`` fp32 of slot ``row_slot[r]`` (0-based) at anchor ``row_anchor[r]`` after the
        drafted tokens ``row_path[r, :row_slot[r]]`` (long ``[R, P]``, P >= max slot; later columns ignored)."""
        a, s = self.hidden.shape[:2]
        _check_rows(row_anchor, row_slot, a, s)
        dev = self.hidden.device
        row_anchor, row_slot = row_anchor.to(dev), row_slot.to(dev)
        if row_path.dim() != 2 or row_path.shape[0] != row_anchor.numel() or (
                row_anchor.numel() and row_path.shape[1] < int(row_slot.max())):
            raise ValueError(f"row_path must be [{row_anchor.numel()}, >= max slot], got {tuple(row_path.shape)}")
        bias = self.drafter.path_bias(self.hidden[row_anchor], self.anchor_tokens[row_anchor], row_path.to(dev),
                                      row_slot)
        return self.unary[row_anchor, row_slot] + bias

    def tree_logits(self, row_anchor: torch.Tensor, row_slot: torch.Tensor,
                    row_path: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(row_logits [R, V], arange(R))``: one q row per tree row. Raises ValueError without ``row_path``."""
        if row_path is None:
            raise ValueError("a semi-autoregressive drafter's q depends on each row's path: pass row_path")
        logits = self.row_logits(row_anchor, row_slot, row_path)
        return logits, torch.arange(logits.shape[0], device=row_anchor.device)

    def _walk(self, rows: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> torch.Tensor:
        """Draw one block per entry of ``rows`` (anchor indices, long ``[M]``) slot by slot at ``temperature`` > 0
        from the conditional q (the training q, :meth:`row_logits`): long ``[M, S]``."""
        s = self.hidden.shape[1]
        path = torch.zeros(rows.numel(), s, dtype=torch.long, device=self.hidden.device)
        with torch.no_grad():
            for k in range(s):
                probs = torch.softmax(self.row_logits(rows, torch.full_like(rows, k), path).float() / temperature, -1)
                cdf = probs.cumsum(dim=-1)  # inverse CDF: ~10x faster than torch.multinomial's one-sample path
                u = torch.rand(rows.numel(), 1, generator=generator).to(cdf.device) * cdf[:, -1:]
                path[:, k] = torch.searchsorted(cdf, u)[:, 0].clamp_max(cdf.shape[-1] - 1)
        return path

    def take(self, lo: int, hi: int) -> "ConditionalSlotQ":
        """Anchors ``lo .. hi-1`` only (same roots)."""
        return ConditionalSlotQ(self.drafter, self.hidden[lo:hi], self.anchor_tokens[lo:hi], self.unary[lo:hi],
                                self.root_hidden, self.root_anchor_tokens, self.root_unary)

    def sample(self, k: int, temperature: float, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``k`` branches per anchor drawn left to right, slot j from ``softmax(q_j(. | y_<j) / T)`` given the
        branch's own earlier draws: long ``[A, k, S]`` (T <= 0: the greedy walk, repeated)."""
        a, s = self.hidden.shape[:2]
        if temperature <= 0:
            return self.greedy()[:, None].expand(-1, k, -1).clone()
        rows = torch.arange(a, device=self.hidden.device).repeat_interleave(k)
        return self._walk(rows, temperature, generator).view(a, k, s)

    def greedy(self) -> torch.Tensor:
        """The block the served drafter proposes at temperature 0 (its greedy walk, ``drafter.sample_branches`` at
        T = 0: DSpark's argmax of each step's logits; DFlash V2's argmax among the slot's top-K candidates):
        long ``[A, S]``."""
        with torch.no_grad():
            return self.drafter.sample_branches(self.hidden.detach(), self.anchor_tokens, 0.0)[0]
