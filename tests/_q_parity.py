"""Served q at T > 0 against the trainer's q, for semi-autoregressive drafters (DFlash V2, DSpark).

At temperature T the server draws each slot of a block from q_k(. | y_<k) and traces the drawn block. Sampling
randomness cannot be replayed, so the check is statistical: for every traced slot, with the trainer's q on the same
prefix (context features from the HF target, the recorded tokens before the slot),

    s = log q(y_k) + H(q_k)     mean 0 and variance Var_q[log q] when y_k ~ q_k,

and ``z = sum s / sqrt(sum Var)`` is ~N(0, 1) when the server samples from the trainer's q (CLT over the slots).
A draw from another q (another temperature, another drafter) moves z by many standard deviations, which the tests
check as the statistic's power. DFlash V2's q lives on each slot's K candidates: a drawn token outside the
trainer's candidates fails at once.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import torch


def slot_log_q(drafter, hidden: torch.Tensor, anchors: torch.Tensor, blocks: torch.Tensor, temperature: float
               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(log q [M, S, N] fp32, index [M, S] of each drafted token in it)`` of ``M`` blocks (``hidden [M, S, H]``,
    anchor tokens ``[M]``, drafted ``blocks [M, S]``): N = K candidates for a drafter with ``candidate_scores``
    (V2), else the vocabulary (DSpark's conditional logits). Raises AssertionError when a drafted token is not
    among V2's candidates."""
    if hasattr(drafter, "candidate_scores"):
        ids, scores = drafter.candidate_scores(hidden, anchors, blocks)
        hit = ids == blocks.unsqueeze(-1)
        assert hit.any(-1).all(), f"a served draft outside the trainer's top-K candidates: {blocks.tolist()}"
        return torch.log_softmax(scores.float() / temperature, -1), hit.float().argmax(-1)
    logits = drafter.conditional_logits(hidden, anchors, blocks)
    return torch.log_softmax(logits.float() / temperature, -1), blocks


@torch.no_grad()
def fit_terms(drafter, feats: torch.Tensor, seq: List[int], records: Sequence[dict], temperature: float,
              q_temperature: float | None = None) -> Tuple[float, float, int]:
    """``(sum s, sum Var, slots)`` over the traced ``records`` (``anchor``, ``proposed``) of one request whose
    token ids are ``seq`` and target context features ``feats [len(seq), K*H]``; q at ``q_temperature`` (default
    ``temperature``: the served one; another value is the power check). One training forward over all the
    anchors (block b sees positions < its anchor: the serving forward's input, ``slot_hidden``)."""
    t = temperature if q_temperature is None else q_temperature
    anchors = torch.tensor([int(r["anchor"]) for r in records], dtype=torch.long)
    blocks = torch.tensor([list(r["proposed"]) for r in records], dtype=torch.long)
    hidden, _, anchor_tokens = drafter.slot_hidden(feats, torch.tensor(seq, dtype=torch.long), anchors)
    lq, idx = slot_log_q(drafter, hidden, anchor_tokens, blocks, t)
    p = lq.exp()
    zero = torch.zeros_like(lq)
    ent = -torch.where(p > 0, p * lq, zero).sum(-1)
    second = torch.where(p > 0, p * lq * lq, zero).sum(-1)
    chosen = lq.gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    return float((chosen + ent).sum()), float((second - ent * ent).clamp_min(0).sum()), int(chosen.numel())


def z_score(terms: Sequence[Tuple[float, float, int]]) -> Tuple[float, int]:
    """``(z, slots)`` pooled over requests' :func:`fit_terms`."""
    s = sum(x[0] for x in terms)
    v = sum(x[1] for x in terms)
    return s / math.sqrt(max(v, 1e-12)), sum(x[2] for x in terms)


def sampled_fit(traced, tok, model, drafter, other, prompts: Sequence[str], n_tokens: int = 48, repeats: int = 4
                ) -> Tuple[float, int, float, float]:
    """Trace ``repeats`` T = 1 requests of ``n_tokens`` per prompt (``traced(prompt, n, temperature=...)``: the
    server's reply with ``meta_info.specopd_trace``) and score every traced slot: ``(z, slots, z under q at
    T = 0.5, z under the ``other`` drafter's q)``. ``tok`` / ``model``: the target's HF tokenizer and fp32 model
    (context features). A draw outside ``other``'s candidates (V2) makes its z -inf-like (-1e9 for that request)."""
    from specopd_trainer.drafters.features import hf_context_features

    served, tempered, wrong = [], [], []
    for prompt in prompts:
        for _ in range(repeats):
            resp = traced(prompt, n_tokens, temperature=1.0)
            seq = tok(prompt)["input_ids"] + list(resp["output_ids"])
            with torch.no_grad():
                feats = hf_context_features(model, torch.tensor(seq), drafter.spec.target_layer_ids)
            records = resp["meta_info"]["specopd_trace"]
            served.append(fit_terms(drafter, feats, seq, records, 1.0))
            tempered.append(fit_terms(drafter, feats, seq, records, 1.0, q_temperature=0.5))
            try:
                wrong.append(fit_terms(other, feats, seq, records, 1.0))
            except AssertionError:  # a draw outside the other drafter's candidates: as wrong as it gets
                wrong.append((-1e9, 1.0, 1))
    z, n = z_score(served)
    return z, n, z_score(tempered)[0], z_score(wrong)[0]
