"""SpecOPD's loss: one minibatch of a scored batch with the drafter as it is now, and the plain one-batch step.

:func:`minibatch_loss` runs the tree loss of ``cfg.loss`` from the loss registry (plus, with root anchors, the
slot-1 correction :func:`root_slot1_correction`); :func:`specopd_step` is sample + score + loss of one minibatch.
"""

from __future__ import annotations

import time
from typing import Dict, List, Tuple

import torch

from specopd_trainer.algorithms.specopd.batch import ScoredBatch, compute_autocast, sample_and_score
from specopd_trainer.algorithms.specopd.config import SpecOPDConfig


def root_slot1_correction(*, loss_alpha: torch.Tensor, kb: int, g: int, p_anchor: torch.Tensor,
                          q_anchor: torch.Tensor, p_root: torch.Tensor, q_root: torch.Tensor,
                          weights: str) -> torch.Tensor:
    """Add-on to a tree E2E-KL loss that estimates its slot-1 term over branch AND root anchors (fp32 scalar).

    The tree loss is ``mean_a S_a + (slots 2..G)`` with ``S_a = (1/G) D_a KL(p_1(a) || q_1(a))`` and
    ``D_a = mean_k c[(a, k), 0] = mean_k (1 + sum_{j>=2} prod_{2<=i<=j} alpha_i)`` (the E2E weight of slot 1, the
    same for plain and accepted-prefix weights). Slot 1 is conditioned on the reference prefix only, so it needs no
    branch: at R root anchors ``S_r = (1/G) D_bar KL(p_1(r) || q_1(r))`` with ``D_bar = mean_a D_a`` (the
    downstream chain is unknown there). Returns ``(sum_r S_r - R mean_a S_a) / (A + R)``, so that loss +
    correction = ``mean over all A + R anchors of S`` + ``(slots 2..G over the A branch anchors)``: the same
    expectation, slot 1 averaged over (A + R) / A times more contexts (Rao-Blackwellisation over anchors).

    loss_alpha: detached ``[A*kb, G]`` alpha of the tree loss's branches (anchor-major); p_anchor / q_anchor:
    target / drafter slot-1 logits ``[A, V]`` at branch anchors; p_root / q_root ``[R, V]``. Raises ValueError
    for a loss without a root-anchor term (:func:`specopd_kernels.losses.root_anchor_losses`).
    """
    from specopd_kernels.losses import root_anchor_losses
    from specopd_kernels.losses.e2e_kl import acceptance_weights
    from specopd_kernels.losses.naive import forward_kl

    if weights not in root_anchor_losses():
        raise ValueError(f"root anchors need loss {' or '.join(root_anchor_losses())}, got {weights!r}")
    a_n, r_n = p_anchor.shape[0], p_root.shape[0]
    d = acceptance_weights(loss_alpha).view(a_n, kb, g)[:, :, 0].mean(1)  # [A], detached
    s_anchor = d * forward_kl(p_anchor, q_anchor, reduction="none") / g  # [A]
    s_root = d.mean() * forward_kl(p_root, q_root, reduction="none") / g  # [R]
    return (s_root.sum() - r_n * s_anchor.mean()) / (a_n + r_n)


def minibatch_loss(drafter, batch: ScoredBatch, m: int, cfg) -> Tuple[torch.Tensor, Dict]:
    """Loss (fp32 scalar with graph) and metrics of minibatch ``m`` of ``batch`` with the drafter as it is now.

    Per share: the drafter's q at its anchors and roots (``drafter.slot_q``: per tree row, conditioned on the
    row's path for semi-autoregressive drafters; slot 1 at the roots), the target rows
    through the frozen head (:func:`target_head_logits`), the tree loss of ``cfg.loss``
    (:func:`specopd_kernels.losses.tree_loss_and_alpha`) plus, with root anchors,
    :func:`root_slot1_correction`; the loss is the anchor-weighted mean over shares. Metrics as in
    :func:`specopd_step` (``draft_s`` / ``score_s`` include the batch's sampling and
    scoring at its first minibatch, 0 at the others)."""
    from specopd_kernels.losses import expected_acceptance_length, get_loss_spec, tree_loss_and_alpha
    from specopd_trainer.algorithms.specopd.sampling import draft_slot_q
    from specopd_trainer.loops.head import target_head_logits

    g = drafter.block_size - 1
    kb = cfg.branches_per_anchor
    bf16_rows = get_loss_spec(cfg.loss).bf16_rows  # the tree form streams bf16 rows in fp32 chunks itself
    t0 = time.monotonic()
    total, alphas, taus, n, rows, n_root, fwd_s = 0.0, [], [], 0, 0, 0, 0.0
    head = drafter._head()
    for sh in batch.parts[m]:
        a_n, r_n = sh.anchors.numel(), sh.roots.numel()
        q = sh.q
        if q is None:
            tf = time.monotonic()
            with compute_autocast(cfg, drafter._device()):
                q = draft_slot_q(drafter, sh.seq, sh.anchors, sh.roots, cfg.compute_dtype)
            fwd_s += time.monotonic() - tf
        sh.q = None  # the graph is consumed by this step's backward
        if a_n == 0:
            continue
        with torch.no_grad():  # tree rows (branch anchors, then nodes) and root rows, no [rows, V] copy
            tree = torch.cat([sh.hidden[:a_n], sh.hidden[a_n + r_n:]]) if r_n else sh.hidden
            # [A + nodes, V]; the E2E-KL losses stream bf16 rows in fp32 chunks (no [rows, V] fp32 copy)
            p_rows = target_head_logits(head, tree, cfg.head_dtype, fp32_out=not bf16_rows)
            p_root = target_head_logits(head, sh.hidden[a_n: a_n + r_n], cfg.head_dtype)  # [R, V]
        pk = sh.packed
        greedy = {}
        if sh.ref is not None:
            greedy = {"greedy_branches": torch.arange(a_n) * kb + cfg.branches, "greedy_tokens": sh.ref,
                      "greedy_weight": cfg.reference_branch}
        # q per tree row: DFlash one row per (anchor, slot); V2 / DSpark one per row, on the row's own path
        draft, row_draft = q.tree_logits(pk.row_anchor, pk.row_slot, pk.row_path)
        loss, alpha = tree_loss_and_alpha(cfg.loss, p_rows, draft, row_draft, pk.row_index, row_token=pk.row_token,
                                          sample_temperature=cfg.temperature, **greedy)
        if r_n:
            loss = loss + root_slot1_correction(loss_alpha=alpha, kb=kb, g=g, p_anchor=p_rows[:a_n].float(),
                                                q_anchor=draft[row_draft[:a_n]], p_root=p_root,
                                                q_root=q.root_logits, weights=cfg.loss)
        alpha = alpha.view(a_n, kb, g)[:, : cfg.branches].reshape(-1, g)  # metrics: sampled branches
        _, tau = expected_acceptance_length(alpha)
        total = total + loss * a_n
        n, n_root, rows = n + a_n, n_root + r_n, rows + sh.hidden.shape[0]
        alphas.append(alpha.mean(0))
        taus.append(float(tau.mean()))
    if n == 0:
        raise ValueError(f"minibatch {m} of this scored batch has no branch anchor")
    first = m == 0
    metrics = {"alpha": torch.stack(alphas).mean(0).tolist(), "est_tau": sum(taus) / len(taus),
               "supervised_tokens": n * kb * g + n_root, "root_anchors": n_root, "scored_rows": rows,
               "draft_s": (batch.draft_s if first else 0.0) + fwd_s, "score_s": batch.score_s if first else 0.0,
               "loss_s": time.monotonic() - t0 - fwd_s}
    return total / n, metrics


def specopd_step(drafter, client, seqs: List, cfg: SpecOPDConfig,
                 gen: torch.Generator) -> Tuple[torch.Tensor, Dict]:
    """Forward + sample + score + loss for one step (no optimiser); returns (loss, metrics).

    One scored batch of one minibatch (:mod:`.batch`, whatever ``cfg.minibatches`` says): the drafter
    forward at the anchors is both the sampling and the loss forward. Branches are trie-packed per anchor
    (:mod:`specopd_trainer.loops.branch_tree`): shared branch prefixes are scored once and the loss runs once per
    distinct row (:func:`specopd_kernels.losses.tree_loss`, equal to the loss on the expanded branches). Metrics:
    ``supervised_tokens`` = anchors x branches x G (branch tokens the loss trains on) + root anchors,
    ``scored_rows`` = distinct target rows behind them (anchor rows + tree nodes), ``alpha`` per slot (mean over
    branches), ``est_tau`` = 1 + E[A] from those alphas, wall seconds ``draft_s`` (drafter forward + sampling +
    packing), ``score_s`` (the server call), ``loss_s`` (target head + loss forward). With
    ``cfg.reference_branch`` the reference continuation is one more branch per anchor (counted in
    ``supervised_tokens``; ``alpha`` / ``est_tau`` stay over the sampled branches). Raises ValueError when no
    sequence has a response position to anchor at.
    """
    return minibatch_loss(drafter, sample_and_score(drafter, client, seqs, cfg, gen, minibatches=1), 0, cfg)
