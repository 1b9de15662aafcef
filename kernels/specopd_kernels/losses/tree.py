"""Losses over a proposal tree: each distinct scored row once, branches gathered by index.

SpecOPD samples K branches per anchor from the drafter. Branches that share their first tokens share tree
nodes (a trie), so the target scores every distinct (prefix, slot) once. Every per-slot quantity of the
losses below depends only on the row (the target's distribution p at that prefix) and the draft row ``row_draft[r]``
it is compared with (DFlash drafts all slots in parallel, so one draft row per (anchor, slot) serves every tree row
of that slot; a drafter whose slot q depends on the tokens drafted before it, DFlash V2 or DSpark, passes one draft
row per tree row, ``row_draft = arange(R)``). So the loss is computed on the R distinct rows and gathered to the
N branches x G slots:

    alpha_r = sum_v min(p_r(v), q_{d(r)}(v))                  (R rows; q softmaxed once per draft row d)
    alpha[n, i] = alpha_{row_index[n, i]}                      (N branches, G slots)
    E2E-TV  = mean_n [1 - (1/G) sum_j prod_{i<=j} alpha[n, i]]  (SpecOPD)

which equals :func:`specopd_kernels.losses.naive.e2e_tv_loss` on the expanded ``[N, G, V]`` tensors, value
and gradient (a row used by m branches receives m times the gradient), at R/(N*G) of the softmax/min cost.
Per-token losses (tv, fkl, rkl) are the mean over the N*G (branch, slot) pairs, i.e. a multiplicity-weighted
mean over rows. E2E-KL (:mod:`.e2e_kl`) weights each (branch, slot) KL by its detached acceptance weight c[n, i]
(the branch's alphas), scattered onto the rows; ``e2e_fkl_is`` puts the branch's own acceptance ratios
min(1, p(x)/q(x)) upstream instead (:func:`specopd_kernels.losses.e2e_kl.accepted_prefix_weights`), reading each
drafted token from ``row_token`` (the token sitting at a tree node's row).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .e2e_kl import acceptance_weights, accepted_prefix_weights
from .naive import e2e_tv_from_alpha
from .tree_fused_pass import DEFAULT_CHUNK_ROWS, row_stats, weighted_rows

__all__ = ["tree_alpha", "tree_alpha_reference", "tree_e2e_tv", "tree_e2e_tv_fused", "tree_e2e_fkl",
           "tree_e2e_fkl_is", "tree_per_token"]


def _check_index(index: torch.Tensor, bound: int, dims: int, name: str) -> None:
    if index.dim() != dims or index.dtype != torch.int64:
        raise ValueError(f"{name} must be int64 with {dims} dims, got {index.dtype} {tuple(index.shape)}")
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= bound):
        raise ValueError(f"{name} entries must lie in [0, {bound}), got [{int(index.min())}, {int(index.max())}]")


def _check(target_rows, draft_logits, row_draft, row_index) -> None:
    for nm, x in (("target_rows", target_rows), ("draft_logits", draft_logits)):
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() != 2:
            raise ValueError(f"{nm} must be a floating [rows, V] tensor, got "
                             f"{getattr(x, 'dtype', type(x))} {tuple(getattr(x, 'shape', ()))}")
    if target_rows.shape[1] != draft_logits.shape[1]:
        raise ValueError(f"vocabulary mismatch: target {target_rows.shape[1]} vs draft {draft_logits.shape[1]}")
    _check_index(row_draft, draft_logits.shape[0], 1, "row_draft")
    if row_draft.numel() != target_rows.shape[0]:
        raise ValueError(f"row_draft has {row_draft.numel()} entries for {target_rows.shape[0]} target rows")
    _check_index(row_index, target_rows.shape[0], 2, "row_index")


def _use_fused_kernel(target_rows: torch.Tensor) -> bool:
    """Whether ``e2e_tv`` takes the Triton alpha kernel for these tensors (:func:`specopd_kernels.verified.choose`
    for op ``e2e_tv``): on CUDA once the GPU acceptance run verified it for its current source (it beats the
    chunked torch path there, see :func:`tree_alpha`), or when ``SPECOPD_E2E_TV`` / ``SPECOPD_KERNELS`` asks."""
    from ..verified import choose
    from .fused import triton_available

    return choose("e2e_tv", target_rows.device, {"triton": lambda d: d.type == "cuda" and triton_available()}
                  ).backend == "triton"


def tree_alpha(target_rows: torch.Tensor, draft_logits: torch.Tensor, row_draft: torch.Tensor,
               row_index: torch.Tensor, name: str = "e2e_tv") -> torch.Tensor:
    """Per-(branch, slot) acceptance probability alpha, fp32 ``[N, G]``, computed once per distinct row.

    target_rows: ``[R, V]`` target logits, one per distinct tree row. draft_logits: ``[Q, V]`` drafter logits,
    one per distinct (anchor, slot) for DFlash (q does not depend on the sampled history), one per tree row for
    semi-autoregressive drafters (q conditioned on the row's path). row_draft: int64 ``[R]``,
    the draft row each target row is compared with. row_index: int64 ``[N, G]`` into the R rows. The draft
    softmax runs once per Q row (gathered by ``row_draft``). Backend: ``e2e_tv_fused`` always uses the Triton
    kernel (CUDA, or TRITON_INTERPRET=1) on the gathered rows; ``e2e_tv`` uses it on CUDA tensors once the GPU
    acceptance run verified it (:mod:`specopd_kernels.verified`) and the row-chunked torch path otherwise.
    Measured on an H200 (``benchmarks/results/kernels_gpu.json``, 4224 rows, V 49k/152k): Triton 2.2-3.9x faster
    than the plain reference in forward + backward, the chunked path 0.4-0.6x; on CPU the chunked path is the fast one (2.5x). Raises ValueError on bad shapes or indices.
    """
    _check(target_rows, draft_logits, row_draft, row_index)
    if name == "e2e_tv_fused" or (name == "e2e_tv" and _use_fused_kernel(target_rows)):
        from .fused import fused_acceptance_alpha

        alpha_rows = fused_acceptance_alpha(target_rows, draft_logits[row_draft])
    else:
        from .chunked import chunked_tree_alpha

        alpha_rows = chunked_tree_alpha(target_rows, draft_logits, row_draft)  # [R], streamed over row chunks
    return alpha_rows[row_index]


def tree_alpha_reference(target_rows: torch.Tensor, draft_logits: torch.Tensor, row_draft: torch.Tensor,
                         row_index: torch.Tensor) -> torch.Tensor:
    """Plain-torch :func:`tree_alpha` (whole ``[R, V]`` tensors, autograd through ``torch.minimum``): the reference
    the chunked path is tested against. Same arguments and result ``[N, G]``."""
    _check(target_rows, draft_logits, row_draft, row_index)
    p = torch.softmax(target_rows.float(), dim=-1)
    q = torch.softmax(draft_logits.float(), dim=-1)[row_draft]
    return torch.minimum(p, q).sum(dim=-1)[row_index]


# Tree forms, one per loss name (registered beside the flat form in :mod:`.registry`). Common signature:
# ``(target_rows, draft_logits, row_draft, row_index, with_alpha, **options)`` -> ``(loss, alpha or None)``, the
# options (row_token, sample_temperature, greedy_branches, greedy_tokens, greedy_weight) as in
# :func:`specopd_kernels.losses.registry.tree_loss_and_alpha`; a form ignores the options it does not use.


def tree_e2e_tv(target_rows, draft_logits, row_draft, row_index, with_alpha: bool = True, **_):
    """E2E-TV (SpecOPD) over the tree: 1 - (1/G) sum_j prod_{i<=j} alpha_i per branch, mean; alpha is the loss's own
    intermediate (no second pass). Backend chosen by :func:`tree_alpha` (Triton on CUDA once verified, chunked torch otherwise)."""
    alpha = tree_alpha(target_rows, draft_logits, row_draft, row_index, "e2e_tv")
    return e2e_tv_from_alpha(alpha), (alpha.detach() if with_alpha else None)


def tree_e2e_tv_fused(target_rows, draft_logits, row_draft, row_index, with_alpha: bool = True, **_):
    """:func:`tree_e2e_tv` with the Triton alpha kernel always (CUDA, or TRITON_INTERPRET=1)."""
    alpha = tree_alpha(target_rows, draft_logits, row_draft, row_index, "e2e_tv_fused")
    return e2e_tv_from_alpha(alpha), (alpha.detach() if with_alpha else None)


def tree_e2e_fkl(target_rows, draft_logits, row_draft, row_index, with_alpha: bool = True, **_):
    """E2E-KL over the tree (:func:`_e2e_fkl_tree` with E2E's acceptance weights)."""
    _check(target_rows, draft_logits, row_draft, row_index)
    return _e2e_fkl_tree(target_rows, draft_logits, row_draft, row_index, with_alpha)


def tree_e2e_fkl_is(target_rows, draft_logits, row_draft, row_index, with_alpha: bool = True, *,
                    row_token: Optional[torch.Tensor] = None, sample_temperature: float = 1.0,
                    greedy_branches: Optional[torch.Tensor] = None, greedy_tokens: Optional[torch.Tensor] = None,
                    greedy_weight: float = 0.5, **_):
    """E2E-KL with accepted-prefix weights over the tree; needs ``row_token`` (int64 ``[R]``) and the branches'
    ``sample_temperature`` (> 0); optional greedy-path branches (:func:`_greedy_mix`, checked by
    :func:`_check_greedy`). Raises ValueError on a missing or malformed ``row_token``, a non-positive temperature
    or bad greedy-path branches."""
    _check(target_rows, draft_logits, row_draft, row_index)
    name = "e2e_fkl_is"
    if row_token is None or row_token.dtype != torch.int64 or row_token.shape != (target_rows.shape[0],):
        raise ValueError(f"loss {name!r} needs row_token: int64 [{target_rows.shape[0]}] (the drafted token "
                         f"at each tree row), got {None if row_token is None else tuple(row_token.shape)}")
    if not sample_temperature > 0:
        raise ValueError(f"sample_temperature must be > 0, got {sample_temperature}")
    greedy = None
    if greedy_branches is not None:
        greedy = _check_greedy(greedy_branches, greedy_tokens, greedy_weight, row_index, draft_logits.shape[1])
    return _e2e_fkl_tree(target_rows, draft_logits, row_draft, row_index, with_alpha, row_token=row_token,
                         sample_temperature=sample_temperature, greedy=greedy)


def tree_per_token(per_token: Callable) -> Callable:
    """The tree form of a per-token loss ``per_token(target, draft, reduction="none") -> [R]`` (tv, fkl, rkl): the
    mean over the N*G (branch, slot) pairs, i.e. a multiplicity-weighted mean over the R rows."""

    def form(target_rows, draft_logits, row_draft, row_index, with_alpha: bool = True, **_):
        _check(target_rows, draft_logits, row_draft, row_index)
        per_row = per_token(target_rows, draft_logits[row_draft], reduction="none")  # [R]
        mult = torch.bincount(row_index.reshape(-1), minlength=target_rows.shape[0]).to(per_row.dtype)
        loss = (per_row * mult).sum() / mult.sum().clamp(min=1)
        if not with_alpha:
            return loss, None
        with torch.no_grad():
            return loss, tree_alpha(target_rows, draft_logits.detach(), row_draft, row_index)

    form.__name__ = form.__qualname__ = f"tree_{per_token.__name__}"
    return form


def _tree_accept_ratio(target_rows, draft_logits, row_draft, row_index, row_token, temperature: float,
                       chunk: int = 256, lse_t: Optional[torch.Tensor] = None) -> torch.Tensor:
    """r[n, i] = min(1, p_i(x_i) / q_i(x_i)) for slots 1..G-1 of every branch, fp32 ``[N, G-1]``, no gradient.

    Slot i's target row is ``row_index[n, i-1]``; its drafted token x_i sits at the next row ``row_index[n, i]``
    (``row_token``); q_i = softmax(draft / temperature) of that row's draft row. The target log-normalisers are
    ``lse_t`` (fp32 ``[R]``, from :func:`.tree_fused_pass.row_stats`) or, if None, computed per distinct row,
    streamed in chunks."""
    with torch.no_grad():
        if lse_t is None:
            lse_t = torch.cat([torch.logsumexp(target_rows[lo:lo + chunk].float(), -1)
                               for lo in range(0, target_rows.shape[0], chunk)] or [target_rows.new_zeros(0)])
        scaled = draft_logits.detach().float() / temperature
        lse_q = torch.logsumexp(scaled, -1)
        rows, tok = row_index[:, :-1], row_token[row_index[:, 1:]]
        if tok.numel() and (int(tok.min()) < 0 or int(tok.max()) >= target_rows.shape[1]):
            raise ValueError("row_token holds a token outside the vocabulary at a node row")
        drows = row_draft[rows]
        lp = target_rows[rows, tok].float() - lse_t[rows]
        lq = scaled[drows, tok] - lse_q[drows]
        return torch.exp(torch.clamp(lp - lq, max=0.0))


def _check_greedy(branches, tokens, weight: float, row_index, vocab: int):
    n, g = row_index.shape
    _check_index(branches, n, 1, "greedy_branches")
    if branches.unique().numel() != branches.numel() or branches.numel() in (0, n):
        raise ValueError("greedy_branches must be distinct and leave at least one sampled branch")
    if tokens is None or tokens.dtype != torch.int64 or tokens.shape != (branches.numel(), g):
        raise ValueError(f"greedy_tokens must be int64 [{branches.numel()}, {g}], got "
                         f"{None if tokens is None else (tokens.dtype, tuple(tokens.shape))}")
    if int(tokens.max()) >= vocab or int(tokens.min()) < -1:
        raise ValueError(f"greedy_tokens must lie in [-1, {vocab}) (-1: past the reference's end)")
    if not 0 < weight < 1:
        raise ValueError(f"greedy_weight must lie in (0, 1), got {weight}")
    return branches, tokens, float(weight)


def _greedy_mix(weights_is: torch.Tensor, draft_logits, row_draft, row_index, greedy) -> torch.Tensor:
    """Per-(branch, slot) weights, already divided by the branch count, mixing the two serving temperatures:

        (1 - lambda) / N_s * c_is[n, i]        sampled branches (T > 0 states: accepted-prefix weights)
        lambda / M * c_0[m, i]                 greedy-path branches (T = 0 states)

    c_0 = :func:`acceptance_weights` of the T=0 acceptance indicators a[m, l] = 1[argmax q_l = x_l] along the greedy
    path x (the target's greedy tokens, so the indicator is exactly whether a T=0 served block accepts slot l): slot
    i weighs (prod_{l<i} a_l) (1 + sum_{j>i} prod_{i<l<=j} a_l), i.e. it is trained where a T=0 block reaches it,
    weighted by the run it would extend; slots past the path's end (token -1) weigh 0. For a DFlash drafter the T=0 verified prefix is always the target's
    greedy path, so these are T=0 serving's on-policy states."""
    branches, tokens, lam = greedy
    n = row_index.shape[0]
    with torch.no_grad():
        argmax = draft_logits.detach().argmax(dim=-1)[row_draft[row_index[branches]]]  # [M, G]
        valid = tokens >= 0
        c0 = acceptance_weights((argmax == tokens).float(), valid)
        sampled = torch.ones(n, dtype=torch.bool, device=row_index.device)
        sampled[branches] = False
        out = weights_is * ((1 - lam) / int(sampled.sum()))
        out[branches] = c0 * (lam / (branches.numel() * row_index.shape[1]))
        return out


def _e2e_fkl_tree(target_rows, draft_logits, row_draft, row_index, with_alpha: bool,
                  chunk: int = DEFAULT_CHUNK_ROWS, row_token: Optional[torch.Tensor] = None,
                  sample_temperature: float = 1.0, greedy=None):
    """E2E-KL over the tree without materialising ``[R, V]`` draft log-probs (with ``row_token``: the
    accepted-prefix weights of ``e2e_fkl_is`` instead of E2E's).

    With w_r = sum of the detached weights c[n, i] / G of the (branch, slot) pairs using row r, and P_d =
    sum_{r: row_draft[r] = d} w_r p_r (``[Q, V]``, accumulated over row chunks without gradient):
    sum_r w_r KL(p_r || q_{d(r)}) = sum_r w_r sum_v p_r log p_r - sum_d <P_d, log q_d>. So the loss is a soft-target
    cross-entropy on the Q draft rows plus a constant, equal in value and gradient to the per-row form. Two
    streamed passes over the target rows (``chunk`` rows at a time, :mod:`.tree_fused_pass`): one log_softmax per
    chunk gives alpha_r, the log-normaliser (the IS ratios' log p(token)) and sum_v p_r log p_r; once the weights
    are known, the second reads the rows of nonzero weight again for P. Gradient flows only into
    ``draft_logits``, through the cross-entropy on the Q draft rows.
    """
    with torch.no_grad():
        q = torch.softmax(draft_logits.detach().float(), dim=-1)
        alpha_rows, lse_t, h_rows = row_stats(target_rows, q, row_draft, chunk)  # pass 1 over the rows
        del q
        alpha = alpha_rows[row_index]  # [N, G]
        if row_token is None:
            weights = acceptance_weights(alpha) / alpha.shape[1]  # [N, G]
        else:
            ratio = _tree_accept_ratio(target_rows, draft_logits, row_draft, row_index, row_token,
                                       sample_temperature, lse_t=lse_t)
            weights = accepted_prefix_weights(alpha, ratio) / alpha.shape[1]
        if greedy is not None:  # weights already averaged over branches: undo the mean below
            weights = _greedy_mix(weights, draft_logits, row_draft, row_index, greedy) * row_index.shape[0]
        w_rows = torch.zeros(target_rows.shape[0], dtype=torch.float32, device=target_rows.device)
        w_rows.index_add_(0, row_index.reshape(-1), weights.reshape(-1))
        neg_entropy = torch.dot(w_rows, h_rows)
        p_bar = weighted_rows(target_rows, lse_t, w_rows, row_draft, draft_logits.shape[0], chunk)  # pass 2
    cross = (p_bar * torch.log_softmax(draft_logits.float(), dim=-1)).sum()
    loss = (neg_entropy - cross) / max(row_index.shape[0], 1)
    return loss, (alpha if with_alpha else None)
