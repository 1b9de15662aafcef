"""DFlash V2 (``DFlash2DraftModel``) on SGLang's CPU engine (CPU adaptation 12).

SGLang 0.5.23 serves a DFlash V2 drafter with the DFLASH worker (``dflash_worker_v2._selector_lattice`` then
``CandidateSelector.sample_path``, whose CPU branch is plain torch). Three pieces of that path do not run on a
CPU-only machine, and are replaced here for CPU tensors only (GPU tensors go to SGLang's own code):

* ``models.dflash._radix_topk``: flashinfer's radix top-k (imported whenever flashinfer is installed) raises
  "device must be a cuda device"; on CPU it is ``torch.topk(scores, k, dim=-1)`` (sorted, largest first), the
  fallback SGLang itself uses without flashinfer;
* ``models.dflash._score_edges`` and ``_follow_maps`` are ``torch.compile(dynamic=True)`` functions: on CPU
  they would be compiled by inductor (a C++ toolchain and minutes of compilation per shape on a 2-core machine,
  once per scheduler process), so the same formulas run eagerly (:func:`score_edges`, :func:`follow_maps`).

The formulas are the DFlash V2 selector's (SGLang ``CandidateSelector.build_lattice``; the trainer's
:class:`specopd_trainer.drafters.dflash2.CandidateSelector`): for drafted slot e with candidates ``c`` (the top-K
of the target head on the drafter hidden ``h_e``) and predecessor ``p`` (the verified anchor for e = 0, else
candidate p of slot e-1), ``score[b, e, p, c] = U[b, e, c] + < A[pred[b, e, p]] * (W h_e), B[cand[b, e, c]] >``.
"""

from __future__ import annotations

import torch


def _on_cpu(t: torch.Tensor) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def score_edges(*, predecessor_table: torch.Tensor, successor_table: torch.Tensor, candidate_ids: torch.Tensor,
                unary_logits: torch.Tensor, hidden: torch.Tensor, anchor_token_ids: torch.Tensor,
                top_k: int) -> torch.Tensor:
    """The selector lattice, eagerly: ``score [bs, S, K, K]`` (predecessor index, candidate index).

    Args:
        predecessor_table, successor_table: the codebooks A, B ``[V, r]``.
        candidate_ids: ``[bs, S, K]`` int64 candidate token ids per drafted slot.
        unary_logits: ``[bs, S, K]`` fp32 transformed head logits of the candidates.
        hidden: ``[bs, S, r]`` the projected drafter hiddens ``W h``.
        anchor_token_ids: ``[bs]`` int64 verified anchor tokens (slot 0's predecessor, repeated K times).
        top_k: K.
    Returns: ``[bs, S, K, K]`` in the dtype of ``unary + A * h`` (fp32 on an fp32 server).
    """
    first = anchor_token_ids.long()[:, None, None].expand(-1, 1, top_k)
    predecessor_ids = torch.cat([first, candidate_ids[:, :-1]], dim=1)  # [bs, S, K]
    states = predecessor_table[predecessor_ids] * hidden[:, :, None, :]  # [bs, S, K_pred, r]
    keys = successor_table[candidate_ids]  # [bs, S, K_cand, r]
    return unary_logits[:, :, None, :] + states @ keys.transpose(-1, -2)


def follow_maps(maps: torch.Tensor, initial_indices: torch.Tensor, edges: int) -> torch.Tensor:
    """Walk ``maps [bs, edges, K]`` (candidate index of slot e+1 chosen after candidate index i of slot e) from
    ``initial_indices [bs]``: the candidate index per slot, ``[bs, edges + 1]`` int64."""
    index, path = initial_indices, [initial_indices]
    for edge in range(edges):
        index = maps[:, edge].gather(-1, index[:, None])[:, 0]
        path.append(index)
    return torch.stack(path, dim=1)


def radix_topk_on_cpu(original_fn, scores, k):
    """AROUND hook for ``models.dflash._radix_topk``: ``(values, indices)`` of ``torch.topk`` for CPU scores."""
    if _on_cpu(scores):
        return torch.topk(scores, k, dim=-1)
    return original_fn(scores, k)


def score_edges_on_cpu(original_fn, **kwargs):
    """AROUND hook for ``models.dflash._score_edges``: :func:`score_edges` for CPU tensors."""
    if _on_cpu(kwargs.get("unary_logits")):
        return score_edges(**kwargs)
    return original_fn(**kwargs)


def follow_maps_on_cpu(original_fn, maps, initial_indices, edges):
    """AROUND hook for ``models.dflash._follow_maps``: :func:`follow_maps` for CPU tensors."""
    if _on_cpu(maps):
        return follow_maps(maps, initial_indices, edges)
    return original_fn(maps, initial_indices, edges)


def register_dflash2_adaptations() -> None:
    """Register the DFlash V2 hooks with SGLang's HookRegistry (CPU engine only)."""
    from sglang_specopd.server import compat

    compat.hook("dflash._radix_topk", radix_topk_on_cpu)
    compat.hook("dflash._score_edges", score_edges_on_cpu)
    compat.hook("dflash._follow_maps", follow_maps_on_cpu)
