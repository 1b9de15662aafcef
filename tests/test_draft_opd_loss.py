"""Draft-OPD's proposal-tree loss (``draft_opd`` in the loss registry): a hand-checkable case, slot masks from
accepted counts, and equality with the flat form (value and gradient) when every anchor has one branch."""

from __future__ import annotations

import math

import pytest
import torch

from specopd_kernels.losses import draft_opd_loss, tree_loss, tree_loss_and_alpha
from specopd_kernels.losses.draft_opd_tree import block_slot_masks

FKL = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)  # KL(p || q), p = [.75, .25], q = [.5, .5]: 0.1308120
RKL = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)  # KL(q || p): 0.1438410


def _logits(probs):
    return torch.log(torch.tensor(probs, dtype=torch.float32))


def test_block_slot_masks_from_accepted_counts() -> None:
    acc, rej = block_slot_masks(torch.tensor([1, 0, 2]), 2)
    assert acc.tolist() == [[True, False], [False, False], [True, True]]
    assert rej.tolist() == [[False, True], [True, True], [False, False]]  # first rejected slot and after it
    acc, rej = block_slot_masks(torch.tensor([1, 0, 3]), 3, first_rejected_only=True)
    assert acc.tolist() == [[True, False, False], [False, False, False], [True, True, True]]
    assert rej.tolist() == [[False, True, False], [True, False, False], [False, False, False]]  # slot accepted+1
    acc, rej = block_slot_masks(torch.tensor([1]), 3, rejected=False)
    assert acc.tolist() == [[True, False, False]] and not rej.any()
    with pytest.raises(ValueError, match=r"\[0, 2\]"):
        block_slot_masks(torch.tensor([3]), 2)


def test_tree_form_hand_case() -> None:
    # two one-branch anchors, G = 2. Rows: anchor rows 0, 1; node rows 2 (anchor 0), 3 (anchor 1); row 4 is a decoy
    # no branch reads (p = [.1, .9]: gathering it would change the value). Every read row: p = [.75, .25];
    # every draft row: q = [.5, .5].
    p = torch.stack([_logits([0.75, 0.25])] * 4 + [_logits([0.1, 0.9])])
    q = torch.stack([_logits([0.5, 0.5])] * 4)
    row_draft = torch.tensor([0, 2, 1, 3, 0])  # anchor a, slot k -> draft row a * 2 + k - 1
    row_index = torch.tensor([[0, 2], [1, 3]])
    acc, rej = block_slot_masks(torch.tensor([1, 0]), 2)
    # anchor 0: slot 1 accepted (FKL), slot 2 rejected (0.8 RKL); anchor 1: both rejected (1 RKL + 0.8 RKL)
    want = (FKL + 0.8 * RKL + RKL + 0.8 * RKL) / (1 + 0.8 + 1 + 0.8)
    assert want == pytest.approx(0.1402219, abs=1e-6)
    got = tree_loss("draft_opd", p, q, row_draft, row_index, accepted_mask=acc, rejected_mask=rej)
    assert got.item() == pytest.approx(want, abs=1e-6)
    # the one-block case of the flat hand case (slot 1 accepted, slot 2 rejected): 0.1366027
    one = tree_loss("draft_opd", p, q, row_draft, row_index[:1], accepted_mask=acc[:1], rejected_mask=rej[:1])
    assert one.item() == pytest.approx(0.1366027027, abs=1e-6)
    # the ablations: forward KL only / reverse KL only on the same slots and weights
    fkl_only = tree_loss("draft_opd", p, q, row_draft, row_index, accepted_mask=acc, rejected_mask=rej,
                         options={"rejected_kl": "forward"})
    assert fkl_only.item() == pytest.approx(FKL, abs=1e-6)
    rkl_only = tree_loss("draft_opd", p, q, row_draft, row_index, accepted_mask=acc, rejected_mask=rej,
                         options={"accepted_kl": "reverse", "rejected_kl": "reverse"})
    assert rkl_only.item() == pytest.approx(RKL, abs=1e-6)
    # gamma = 0.5, lambda_rej = 2: (FKL + 2 (0.5 + 1 + 0.5) RKL) / (1 + 2 * 2)
    g2 = tree_loss("draft_opd", p, q, row_draft, row_index, accepted_mask=acc, rejected_mask=rej,
                   options={"gamma": 0.5, "lambda_rej": 2.0})
    assert g2.item() == pytest.approx((FKL + 4 * RKL) / 5, abs=1e-6)
    # alpha = sum min(p, q) = .5 + .25 = .75 on every slot
    _, alpha = tree_loss_and_alpha("draft_opd", p, q, row_draft, row_index, accepted_mask=acc, rejected_mask=rej)
    assert torch.allclose(alpha, torch.full((2, 2), 0.75))


def test_tree_form_refuses_bad_masks() -> None:
    p, q = torch.zeros(4, 3), torch.zeros(4, 3)
    rd, idx = torch.tensor([0, 2, 1, 3]), torch.tensor([[0, 2], [1, 3]])
    acc, rej = block_slot_masks(torch.tensor([1, 0]), 2)
    with pytest.raises(ValueError, match="needs rejected_mask"):
        tree_loss("draft_opd", p, q, rd, idx, accepted_mask=acc)
    with pytest.raises(ValueError, match="overlap"):
        tree_loss("draft_opd", p, q, rd, idx, accepted_mask=acc, rejected_mask=acc)
    with pytest.raises(ValueError, match="needs accepted_mask"):
        tree_loss("draft_opd", p, q, rd, idx, accepted_mask=acc[:1], rejected_mask=rej)


@pytest.mark.parametrize("directions", [("forward", "reverse"), ("forward", "forward"), ("reverse", "reverse")])
def test_tree_form_equals_flat_form_with_one_branch_per_anchor(directions) -> None:
    from specopd_trainer.loops.branch_tree import pack_branches

    n, g, v = 6, 4, 13
    gen = torch.Generator().manual_seed(3)
    packed = pack_branches(torch.randint(v, (n, 1, g), generator=gen), g - 1)
    rows = n + packed.num_nodes
    target = torch.randn(rows, v, generator=gen) * 3
    draft = (torch.randn(n * g, v, generator=gen) * 3).requires_grad_(True)
    row_draft = packed.row_anchor * g + packed.row_slot
    acc, rej = block_slot_masks(torch.tensor([0, 1, 2, 3, 4, 2]), g)
    rej[5, 3] = False  # a slot neither accepted nor rejected (e.g. past the rollout's end) is not supervised
    opts = {"accepted_kl": directions[0], "rejected_kl": directions[1], "gamma": 0.7}
    tree = tree_loss("draft_opd", target, draft, row_draft, packed.row_index, accepted_mask=acc, rejected_mask=rej,
                     options=opts)
    (gt,) = torch.autograd.grad(tree, draft)
    # expanded [N, G, V]: branch n's slot i reads target row row_index[n, i] and draft row n * G + i
    flat = draft_opd_loss(target[packed.row_index], draft.view(n, g, v), acc, rej, **opts)
    (gf,) = torch.autograd.grad(flat, draft)
    assert 0 < flat.item() and tree.item() == pytest.approx(flat.item(), rel=1e-6)
    assert torch.allclose(gt, gf, atol=1e-7)
    assert gf[5 * g + 3].abs().sum() == 0 and gf[0].abs().sum() > 0
