"""Row-chunked acceptance probability for proposal trees: the eager (CPU / any device) fast path.

The plain form in :func:`specopd_kernels.losses.tree.tree_alpha_reference` materialises four ``[R, V]`` fp32
tensors (softmax p, the gathered q, min(p, q) and autograd's mask) and a second softmax pass for the metrics; at
R ~ 1.4k rows x V = 49k that is ~1 GB of memory traffic per tensor and dominates a SpecOPD step on CPU. This
autograd function streams the R target rows in chunks of ``chunk_rows``:

    forward   alpha_r = sum_v min(p_r(v), q_{d(r)}(v)),  p_r = softmax(target_r), q = softmax(draft) (Q rows, once)
    backward  dL/dq_d(v) = sum_{r: d(r)=d} g_r * 1[q_d(v) < p_r(v)]       (SpecOPD: d alpha / d q(v) = 1[q < p])
              dL/d draft_d = q_d * (dL/dq_d - <dL/dq_d, q_d>)             (softmax Jacobian)

saving only the inputs and the ``[Q, V]`` q (p is recomputed per chunk in backward). Same value and gradient as
the reference (ties q == p get no gradient, as in the formula; the reference's ``torch.minimum`` splits them,
which only matters where both are exactly equal, e.g. both 0). The target side gets no gradient (frozen).
"""

from __future__ import annotations

import torch

__all__ = ["chunked_tree_alpha"]

DEFAULT_CHUNK_ROWS = 64


class _ChunkedTreeAlpha(torch.autograd.Function):
    @staticmethod
    def forward(ctx, target_rows, draft_logits, row_draft, chunk_rows: int):
        q = torch.softmax(draft_logits.float(), dim=-1)  # [Q, V]
        alpha = torch.empty(target_rows.shape[0], dtype=torch.float32, device=target_rows.device)
        for s in range(0, target_rows.shape[0], chunk_rows):
            e = min(s + chunk_rows, target_rows.shape[0])
            p = torch.softmax(target_rows[s:e].float(), dim=-1)
            alpha[s:e] = torch.minimum(p, q[row_draft[s:e]]).sum(dim=-1)
        ctx.save_for_backward(target_rows, q, row_draft)
        ctx.chunk_rows = chunk_rows
        ctx.draft_dtype = draft_logits.dtype
        return alpha

    @staticmethod
    def backward(ctx, grad_alpha):
        target_rows, q, row_draft = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return None, None, None, None
        grad_q = torch.zeros_like(q)
        g = grad_alpha.float()
        for s in range(0, target_rows.shape[0], ctx.chunk_rows):
            e = min(s + ctx.chunk_rows, target_rows.shape[0])
            p = torch.softmax(target_rows[s:e].float(), dim=-1)
            idx = row_draft[s:e]
            contrib = (q[idx] < p).to(torch.float32).mul_(g[s:e, None])
            grad_q.index_add_(0, idx, contrib)
        grad_logits = q * (grad_q - (grad_q * q).sum(dim=-1, keepdim=True))
        return None, grad_logits.to(ctx.draft_dtype), None, None


def chunked_tree_alpha(target_rows: torch.Tensor, draft_logits: torch.Tensor, row_draft: torch.Tensor,
                       chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """Per-row acceptance probability fp32 ``[R]``: alpha_r = sum_v min(softmax(target_r), softmax(draft_{d(r)})).

    target_rows: ``[R, V]`` target logits (any float dtype; no gradient flows to them). draft_logits: ``[Q, V]``
    drafter logits (gradient flows). row_draft: int64 ``[R]`` in ``[0, Q)``. chunk_rows: rows per streamed chunk
    (memory ``chunk_rows x V`` fp32 per temporary). Softmaxes in fp32. Shapes and indices are validated by the
    caller (:func:`specopd_kernels.losses.tree.tree_alpha`). Source: SpecOPD acceptance alpha = 1 - TV(p, q).
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    return _ChunkedTreeAlpha.apply(target_rows.detach(), draft_logits, row_draft, chunk_rows)
