"""The trainable DSpark drafter: SGLang 0.5.23's ``DSparkDraftModel`` (``sglang/srt/models/dspark.py``).

Backbone: DFlash (no conv). Block (``dspark_components/dspark_draft.py`` ``DraftBlockProposer``): anchor-first
(``sample_from_anchor``, the default) runs gamma = B-1 rows ``[anchor, MASK x (gamma-1)]`` at positions
``anchor .. anchor+gamma-1`` and row k-1 feeds drafted slot k; otherwise B rows ``[anchor, MASK x gamma]`` and
row k feeds slot k (the DFlash convention). Head (``draft_markov_block`` / ``MarkovSampleStep``): slot k's step
logits are ``h_k @ lm_head.T`` (the base logits) + the Markov bias of the token drafted before it
(:mod:`.markov`); serving draws left to right, argmax at temperature 0, else from ``softmax(step / T)`` over the
whole vocabulary (SGLang draws by Gumbel-max; the distribution is the same), and the verifier's q is that
softmax of the kept step logits (``dspark_verify.py``). The confidence head scores each drafted slot
(:meth:`DSparkDrafter.confidence`).
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang_specopd.wire.drafters.dspark import DSparkSpec
from specopd_trainer.drafters.markov import MARKOV_HEADS, ConfidenceHead
from specopd_trainer.drafters.registry import register_drafter
from specopd_trainer.drafters.semi_ar import SemiARDrafter, path_previous, pick_slot, previous_tokens


@register_drafter("dspark")
class DSparkDrafter(SemiARDrafter):
    """DSpark drafter built from a :class:`DSparkSpec` (``block_size`` = gamma + 1; fresh weights =
    ``init_drafter_tensors(spec, seed)``: zero ``markov_w2`` and biases, so no Markov bias at init)."""

    spec: DSparkSpec

    def _build_heads(self, spec: DSparkSpec) -> None:
        self.markov_head = MARKOV_HEADS[spec.markov_head_type](spec.vocab_size, spec.markov_rank, spec.hidden_size)
        self.confidence_head = ConfidenceHead(spec.hidden_size, spec.markov_rank, spec.confidence_head_with_markov)
        self.first_slot_row = 0 if spec.sample_from_anchor else 1

    @property
    def num_query_rows(self) -> int:
        return self.spec.num_query_rows

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [..., H] @ lm_head.T`` -> ``[..., V]`` fp32 (``compute_base_logits``; no muP divisor)."""
        return self._head().logits(hidden).float()

    def markov_bias(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Bias ``[M, S, V]`` fp32 of every slot for ``hidden [M, S, H]`` and previous tokens ``prev [M, S]``."""
        head = self.markov_head
        if not head.stateful:
            return head.step_bias(prev, hidden, None)[0].float()
        state, out = head.init_state(hidden[:, 0]), []
        for k in range(hidden.shape[1]):
            bias, state = head.step_bias(prev[:, k], hidden[:, k], state)
            out.append(bias.float())
        return torch.stack(out, dim=1)

    def unary_logits(self, hidden: torch.Tensor, head=None) -> torch.Tensor:
        """The base logits ``[..., V]`` fp32 (``head``: replaces the target head's ``logits``)."""
        return (head or self._head().logits)(hidden).float()

    def path_bias(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, path: torch.Tensor,
                  slot: torch.Tensor) -> torch.Tensor:
        """The Markov bias ``[M, V]`` fp32 of slot ``slot[m]`` given the row's ``path`` (see
        :meth:`SemiARDrafter.path_bias`): stateless heads read the token before the slot; the rnn head runs its
        state through the path's earlier slots first (rows stop at their own slot)."""
        head, dev = self.markov_head, hidden.device
        rows = torch.arange(hidden.shape[0], device=dev)
        state = head.init_state(hidden[:, 0])
        if head.stateful:
            for k in range(int(slot.max()) if slot.numel() else 0):
                prev = path_previous(anchor_tokens, path, torch.full_like(slot, k))
                nxt = head.next_state(prev, hidden[:, k], state)
                state = torch.where((k < slot).view(-1, 1), nxt, state)
        return head.step_bias(path_previous(anchor_tokens, path, slot), hidden[rows, slot], state)[0].float()

    def conditional_logits(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor,
                           branch_tokens: torch.Tensor) -> torch.Tensor:
        """Step logits ``[M, S, V]`` fp32 of slot k given the branch's tokens before it (teacher forcing):
        base logits + Markov bias. ``hidden [M, S, H]``, ``anchor [M]``, ``branch [M, S]`` long."""
        prev = previous_tokens(anchor_tokens, branch_tokens).to(hidden.device)
        return self.base_logits(hidden) + self.markov_bias(hidden, prev)

    def branch_log_probs(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, branch_tokens: torch.Tensor,
                         temperature: float = 1.0) -> torch.Tensor:
        """``log q_k(y_k | y_<k)`` ``[M, S]`` fp32 of the branch's own tokens at ``temperature`` > 0 (the served
        ``softmax(step / T)``). Raises ValueError for temperature <= 0."""
        if temperature <= 0:
            raise ValueError(f"branch_log_probs needs temperature > 0 (0 is a point mass), got {temperature}")
        logq = torch.log_softmax(self.conditional_logits(hidden, anchor_tokens, branch_tokens) / temperature, -1)
        return logq.gather(-1, branch_tokens.long().to(logq.device).unsqueeze(-1)).squeeze(-1)

    def sample_branches(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, temperature: float = 0.0,
                        generator: Optional[torch.Generator] = None, uniforms: Optional[torch.Tensor] = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft ``M`` blocks left to right (``hidden [M, S, H]``, ``anchor [M]``): ``(tokens [M, S] long,
        log q [M, S] fp32)``. Temperature 0: argmax of the step logits (log q = 0); else inverse-CDF draws from
        ``softmax(step / T)`` with ``uniforms [M, S]`` (default ``torch.rand`` from ``generator``)."""
        m, s = hidden.shape[:2]
        base = self.base_logits(hidden)
        u = None if temperature <= 0 else self._uniforms(m, s, uniforms, generator, hidden.device)
        head = self.markov_head
        prev, state, tokens, logq = anchor_tokens.long().to(hidden.device), head.init_state(hidden[:, 0]), [], []
        for k in range(s):
            bias, state = head.step_bias(prev, hidden[:, k], state)
            prev, lq = pick_slot(base[:, k] + bias.float(), temperature, None if u is None else u[:, k])
            tokens.append(prev)
            logq.append(lq)
        return torch.stack(tokens, dim=1), torch.stack(logq, dim=1)

    def confidence(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, draft_tokens: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-slot acceptance ``(sigmoid(raw) [M, S], raw [M, S])`` fp32 of drafted tokens ``[M, S]`` with
        ``hidden [M, S, H]`` (``DSparkConfidenceHead.predict`` at sts temperature 1)."""
        prev = previous_tokens(anchor_tokens, draft_tokens).to(hidden.device)
        emb = self.markov_head.embed(prev) if self.confidence_head.with_markov else None
        raw = self.confidence_head(hidden, emb).float()
        return torch.sigmoid(raw), raw
