"""The trainable DFlash V2 drafter: SGLang 0.5.23's ``DFlash2DraftModel`` (``sglang/srt/models/dflash.py``).

Backbone: DFlash with a grouped dynamic conv around each sublayer (:mod:`.conv`). Head: the low-rank candidate
selector (``CandidateSelector``; worker ``dflash_worker_v2.py`` ``_selector_lattice`` / ``_SelectorDraftSampler``).
For drafted slot k (hidden ``h_k``, slots 1..B-1 = rows 1..B-1 of ``[anchor, MASK x (B-1)]``):

* candidates: the top-K token ids of the raw head logits ``h_k @ lm_head.T`` (``candidate_topk``); their unary
  scores ``U_k(c)`` = the logits times ``output_multiplier``, then ``softcap * tanh(. / softcap)`` if set;
* score of candidate c after predecessor p: ``U_k(c) + < A[p] * (W h_k), B[c] >`` with ``A`` / ``B`` the
  predecessor / successor codebooks ``[V, r]`` and ``W`` the hidden projection ``[r, H]``; p is the verified
  anchor for slot 1 and the token drafted at slot k-1 after it (``build_lattice``);
* serving walks left to right: slot k picks among its K candidates given the previous pick, ``argmax`` at
  temperature 0, else a draw from ``q_k = softmax(score / T)`` over the K candidates (``sample_path``; q is 0
  outside them, and the verifier reads q from there).

Training: :meth:`conditional_logits` gives the same scores for EVERY token of the vocabulary (``U`` from all head
logits, no top-K cut: finite and differentiable, so cross-entropy trains head and selector); the served
distribution is the softmax of those scores restricted to the top-K (:meth:`candidate_scores`,
:meth:`branch_log_probs`).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sglang_specopd.wire.drafters.dflash2 import DFlash2Spec
from specopd_trainer.drafters.conv import ConvDecoderLayer
from specopd_trainer.drafters.dflash import DFlashDrafter
from specopd_trainer.drafters.registry import register_drafter
from specopd_trainer.drafters.semi_ar import SemiARDrafter, path_previous, pick_slot, previous_tokens


class CandidateSelector(nn.Module):
    """``predecessor_codebook [V, r]``, ``successor_codebook [V, r]``, ``hidden_projection: Linear(H, r)``."""

    def __init__(self, hidden: int, vocab: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = int(top_k)
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def state(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """``A[prev] * (W h)``: ``[..., r]`` fp32 for hidden ``[..., H]`` and long ``prev [...]``."""
        return (self.predecessor_codebook[prev] * self.hidden_projection(hidden)).float()

    def candidate_scores(self, hidden: torch.Tensor, prev: torch.Tensor, cand_ids: torch.Tensor,
                         unary: torch.Tensor) -> torch.Tensor:
        """Scores ``[..., K]`` of ``cand_ids [..., K]`` with unary ``[..., K]`` after ``prev [...]``."""
        keys = self.successor_codebook[cand_ids].float()
        return unary + (self.state(hidden, prev).unsqueeze(-2) * keys).sum(dim=-1)

    def vocab_scores(self, hidden: torch.Tensor, prev: torch.Tensor, unary: torch.Tensor) -> torch.Tensor:
        """Scores ``[..., V]`` of every token with unary ``[..., V]`` after ``prev [...]``."""
        st = self.state(hidden, prev)
        return unary + (st.reshape(-1, st.shape[-1]) @ self.successor_codebook.float().T).view(unary.shape)


@register_drafter("dflash2")
class DFlash2Drafter(SemiARDrafter):
    """DFlash V2 drafter built from a :class:`DFlash2Spec` (fresh weights = ``init_drafter_tensors(spec, seed)``:
    identity conv, zero successor codebook)."""

    spec: DFlash2Spec

    @staticmethod
    def _make_layer(spec: DFlash2Spec) -> nn.Module:
        if not spec.has_conv:
            return DFlashDrafter._make_layer(spec)
        return ConvDecoderLayer(spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim,
                                spec.intermediate_size, spec.rms_norm_eps, spec.rope_theta, spec.conv_kernel_size,
                                spec.conv_group_size)

    def _build_heads(self, spec: DFlash2Spec) -> None:
        self.candidate_selector = CandidateSelector(spec.hidden_size, spec.vocab_size, spec.selector_rank,
                                                    spec.selector_top_k)

    # ---- unary scores -------------------------------------------------------------------------------------
    def _transform(self, logits: torch.Tensor) -> torch.Tensor:
        """``output_multiplier`` then softcap, in fp32 (``DFlash2DraftModel._transform_unary_logits``)."""
        logits = logits.float()
        if self.spec.output_multiplier != 1.0:
            logits = logits * self.spec.output_multiplier
        cap = self.spec.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def candidates(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-K of the raw head logits of ``hidden [..., H]``: ``(ids [..., K] long, unary [..., K] fp32)``, sorted
        by logit (the transform is applied after the cut, as SGLang)."""
        vals, ids = torch.topk(self._head().logits(hidden), self.candidate_selector.top_k, dim=-1)
        return ids, self._transform(vals)

    # ---- conditionals -------------------------------------------------------------------------------------
    def conditional_logits(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor,
                           branch_tokens: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary scores ``[M, S, V]`` fp32 of slot k after the branch's token k-1 (the anchor for k=1):
        ``U_k`` over all tokens + the selector term. ``hidden [M, S, H]``, ``anchor [M]``, ``branch [M, S]``."""
        prev = previous_tokens(anchor_tokens, branch_tokens)
        return self.candidate_selector.vocab_scores(hidden, prev, self._transform(self._head().logits(hidden)))

    def unary_logits(self, hidden: torch.Tensor, head=None) -> torch.Tensor:
        """``U`` over the whole vocabulary: the transformed head logits, fp32 ``[..., V]`` (``head``: replaces the
        target head's ``logits``)."""
        return self._transform((head or self._head().logits)(hidden))

    def path_bias(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, path: torch.Tensor,
                  slot: torch.Tensor) -> torch.Tensor:
        """The selector term ``<A[y_{k-1}] * (W h_k), B[.]>`` ``[M, V]`` fp32 of slot ``slot[m]`` after the token
        before it on the row's ``path`` (the anchor for slot 0); see :meth:`SemiARDrafter.path_bias`."""
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        state = self.candidate_selector.state(hidden[rows, slot], path_previous(anchor_tokens, path, slot))
        return state @ self.candidate_selector.successor_codebook.float().T

    def candidate_scores(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, branch_tokens: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Served scores over each slot's K candidates given the branch's previous token: ``(ids [M, S, K],
        scores [M, S, K] fp32)``; ``q_k = softmax(scores / T)`` is SGLang's verify q at temperature T."""
        ids, unary = self.candidates(hidden)
        prev = previous_tokens(anchor_tokens, branch_tokens)
        return ids, self.candidate_selector.candidate_scores(hidden, prev, ids, unary)

    def branch_log_probs(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, branch_tokens: torch.Tensor,
                         temperature: float = 1.0) -> torch.Tensor:
        """``log q_k(y_k | y_{k-1})`` ``[M, S]`` fp32 of the branch's own tokens at ``temperature`` > 0: -inf where
        ``y_k`` is not among slot k's K candidates. Raises ValueError for temperature <= 0."""
        if temperature <= 0:
            raise ValueError(f"branch_log_probs needs temperature > 0 (0 is a point mass), got {temperature}")
        ids, scores = self.candidate_scores(hidden, anchor_tokens, branch_tokens)
        logq = torch.log_softmax(scores / temperature, dim=-1)
        hit = ids == branch_tokens.unsqueeze(-1).to(ids.device)
        return logq.masked_fill(~hit, float("-inf")).logsumexp(dim=-1)

    def sample_branches(self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, temperature: float = 0.0,
                        generator: Optional[torch.Generator] = None, uniforms: Optional[torch.Tensor] = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Walk ``M`` blocks left to right from the anchors (``hidden [M, S, H]``, ``anchor [M]``): ``(tokens [M, S]
        long, log q [M, S] fp32)``. Temperature 0: argmax among the candidates (log q = 0, a point mass); else
        inverse-CDF draws with ``uniforms [M, S]`` (default ``torch.rand`` from ``generator``), SGLang's walk."""
        m, s = hidden.shape[:2]
        ids, unary = self.candidates(hidden)
        u = None if temperature <= 0 else self._uniforms(m, s, uniforms, generator, hidden.device)
        prev, tokens, logq = anchor_tokens.long().to(hidden.device), [], []
        for k in range(s):
            scores = self.candidate_selector.candidate_scores(hidden[:, k], prev, ids[:, k], unary[:, k])
            pick, lq = pick_slot(scores, temperature, None if u is None else u[:, k])
            prev = ids[:, k].gather(1, pick[:, None])[:, 0]
            tokens.append(prev)
            logq.append(lq)
        return torch.stack(tokens, dim=1), torch.stack(logq, dim=1)
