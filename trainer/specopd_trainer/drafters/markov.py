"""DSpark's Markov heads and confidence head, numerically SGLang 0.5.23 ``sglang/srt/models/dspark.py``.

A Markov head corrects each drafted slot's base logits (draft hidden @ target LM head) with a bias computed from
the token drafted one slot before (the verified anchor for the first slot); ``e(p) = markov_w1[p]`` is a rank-r
embedding and ``markov_w2 [V, r]`` maps back to the vocabulary:

* ``vanilla`` (``VanillaMarkov``): ``bias = markov_w2 @ e(p)``, i.e. ``logits_k += e(y_{k-1}) W2^T``;
* ``gated`` (``GatedMarkovHead``): ``bias = markov_w2 @ (sigmoid(gate_proj([h_k, e(p)])) * e(p))``;
* ``rnn`` (``RNNHead``): a state ``s`` (zeros at the first slot) with
  ``[g, c, o] = joint_proj([s, e(p), h_k])``, ``s' = sigmoid(g) * s + (1 - sigmoid(g)) * tanh(c)``,
  ``bias = markov_w2 @ tanh(o)``: slot k then depends on every earlier drafted token.

The confidence head (``DSparkConfidenceHead``) gives a per-slot acceptance logit
``proj([h_k, e(y_{k-1})])`` (``[h_k]`` alone without markov), served as ``sigmoid(logit / sts_temperature)``
(temperature 1 unless SGLang calibrates it).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn


class VanillaMarkov(nn.Module):
    """``markov_w1: Embedding(V, r)``, ``markov_w2: Linear(r, V, bias=False)``; no state."""

    stateful = False

    def __init__(self, vocab: int, rank: int, hidden: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)

    def embed(self, prev: torch.Tensor) -> torch.Tensor:
        """``e(prev)``: ``[..., r]`` for long ``prev [...]``."""
        return self.markov_w1(prev.long())

    def init_state(self, hidden: torch.Tensor) -> Optional[torch.Tensor]:
        """The state before the first slot for ``hidden [M, H]`` (None: stateless)."""
        return None

    def step_bias(self, prev: torch.Tensor, hidden: torch.Tensor, state: Optional[torch.Tensor]
                  ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``(bias [..., V], next state)`` for ``prev [...]`` and the slot's ``hidden [..., H]``; a stateless head
        takes any leading shape (all slots at once)."""
        return self.markov_w2(self.embed(prev)), state


class GatedMarkov(VanillaMarkov):
    """Vanilla plus ``gate_proj: Linear(H + r, r)`` (with bias)."""

    def __init__(self, vocab: int, rank: int, hidden: int):
        super().__init__(vocab, rank, hidden)
        self.gate_proj = nn.Linear(hidden + rank, rank)

    def step_bias(self, prev: torch.Tensor, hidden: torch.Tensor, state: Optional[torch.Tensor]
                  ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        e = self.embed(prev)
        gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, e], dim=-1))).to(e.dtype)
        return self.markov_w2(gate * e), state


class RNNMarkov(VanillaMarkov):
    """Vanilla plus ``joint_proj: Linear(2r + H, 3r)`` (with bias) and a rank-r recurrent state."""

    stateful = True

    def __init__(self, vocab: int, rank: int, hidden: int):
        super().__init__(vocab, rank, hidden)
        self.rank = int(rank)
        self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def init_state(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden.shape[0], self.rank, device=hidden.device, dtype=hidden.dtype)

    def _step(self, prev: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.cat([state, self.embed(prev), hidden], dim=-1)
        gate_raw, cand_raw, out_raw = self.joint_proj(z).chunk(3, dim=-1)
        gate = torch.sigmoid(gate_raw)
        return gate * state + (1.0 - gate) * torch.tanh(cand_raw), out_raw

    def next_state(self, prev: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """The state after one slot (:meth:`step_bias` without the ``[M, V]`` bias): ``[M, r]``."""
        return self._step(prev, hidden, state)[0]

    def step_bias(self, prev: torch.Tensor, hidden: torch.Tensor, state: Optional[torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """One slot: ``prev [M]``, ``hidden [M, H]``, ``state [M, r]``."""
        state, out_raw = self._step(prev, hidden, state)
        return self.markov_w2(torch.tanh(out_raw)), state


MARKOV_HEADS = {"vanilla": VanillaMarkov, "gated": GatedMarkov, "rnn": RNNMarkov}


class ConfidenceHead(nn.Module):
    """``proj: Linear(H (+ r with markov), 1)`` (with bias)."""

    def __init__(self, hidden: int, rank: int, with_markov: bool):
        super().__init__()
        self.with_markov = bool(with_markov)
        self.proj = nn.Linear(hidden + (rank if with_markov else 0), 1)

    def forward(self, hidden: torch.Tensor, prev_embed: Optional[torch.Tensor]) -> torch.Tensor:
        """Raw acceptance logits ``[...]`` for ``hidden [..., H]`` and ``e(y_{k-1}) [..., r]`` (with markov)."""
        x = torch.cat([hidden, prev_embed.to(hidden.dtype)], dim=-1) if self.with_markov else hidden
        return self.proj(x.to(self.proj.weight.dtype)).squeeze(-1)
