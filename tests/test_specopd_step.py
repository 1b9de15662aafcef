"""One SpecOPD step against a stand-in scorer: the greedy branch option and the request/row bookkeeping."""

from __future__ import annotations


import pytest
import torch

from _sft_fixture import tiny_drafter, tiny_sequences
from fakes.scorers import HashScorer as _HashScorer
from fakes.scorers import KeepScorer as _Keep
from fakes.scorers import Scorer as _Scorer
from fakes.scorers import record_packing as _record_packing


@pytest.mark.parametrize("greedy", [False, True])
def test_greedy_branch_is_the_argmax_block(monkeypatch, greedy):
    import specopd_trainer.loops.branch_tree as bt
    from specopd_trainer.algorithms.specopd.config import SpecOPDConfig
    from specopd_trainer.algorithms.specopd.loss import specopd_step

    seen = []
    real = bt.pack_branches
    monkeypatch.setattr(bt, "pack_branches", lambda branches, depth: seen.append(branches.clone()) or
                        real(branches, depth))
    drafter, seqs, scorer = tiny_drafter(), tiny_sequences(2), _Scorer()
    cfg = SpecOPDConfig(compute_dtype="float32", anchors_per_seq=5, branches=6, seqs_per_step=2, temperature=100.0, greedy_branch=greedy)
    loss, m = specopd_step(drafter, scorer, seqs, cfg, torch.Generator().manual_seed(0))
    assert torch.isfinite(loss) and 0.0 <= loss.item() <= 1.0
    g = drafter.block_size - 1
    assert m["supervised_tokens"] == 2 * 5 * 6 * g and len(scorer.requests) == 1
    for s, branches, ref in zip(seqs, seen, scorer.requests[0].references):
        anchors = torch.tensor([t.anchor for t in ref.trees])
        with torch.no_grad():
            argmax = drafter.logits(s.features.float(), s.token_ids, anchors)[0][:, 1:].argmax(-1)  # [A, G]
        assert branches.shape == (5, 6, g)
        assert torch.equal(branches[:, 0], argmax) is greedy  # sampled at temperature 100: not all argmax


def test_e2e_fkl_is_step_equals_the_expanded_loss_on_the_sampled_branches(monkeypatch):
    """The step hands the loss each branch's sampled tokens (row_token) and the sampling temperature: its loss
    equals the registry's expanded E2E-KL-IS on the branches it sampled, the rows the scorer returned and the
    drafter's own logits."""
    from specopd_kernels.losses import get_loss
    from specopd_trainer.algorithms.specopd.config import SpecOPDConfig
    from specopd_trainer.algorithms.specopd.loss import specopd_step
    from specopd_trainer.loops.head import target_head_logits

    packed = _record_packing(monkeypatch)
    drafter, seqs, scorer = tiny_drafter(), tiny_sequences(2), _Keep()
    outputs = scorer.outputs
    cfg = SpecOPDConfig(compute_dtype="float32", anchors_per_seq=4, branches=5, seqs_per_step=2, temperature=0.8, loss="e2e_fkl_is",
                        head_dtype="float32")
    loss, m = specopd_step(drafter, scorer, seqs, cfg, torch.Generator().manual_seed(1))
    g = drafter.block_size - 1
    total, n = 0.0, 0
    for s, (branches, pk), ref, out in zip(seqs, packed, scorer.requests[0].references, outputs):
        anchors = torch.tensor([t.anchor for t in ref.trees])
        with torch.no_grad():
            q = drafter.logits(s.features.float(), s.token_ids, anchors)[0][:, 1:]  # [A, G, V]
            p_rows = target_head_logits(drafter._head(), out.hidden, "float32")
        a, k = branches.shape[:2]
        expanded = get_loss("e2e_fkl_is")(p_rows[pk.row_index], q[:, None].expand(a, k, g, q.shape[-1]).reshape(a * k, g, -1),
                                          branches.reshape(a * k, g), 0.8)
        total, n = total + expanded.item() * a, n + a
    assert loss.item() == pytest.approx(total / n, rel=1e-4)
    assert m["supervised_tokens"] == 2 * 4 * 5 * g and loss.item() > 0


def test_reference_branch_is_the_reference_continuation(monkeypatch):
    """With reference_branch = lambda, branch K of every anchor is the reference continuation (-1 past the end,
    packed as token 0), counted as supervised; the config refuses it without e2e_fkl_is."""
    import specopd_trainer.loops.branch_tree as bt
    from specopd_trainer.algorithms.specopd.config import SpecOPDConfig
    from specopd_trainer.algorithms.specopd.loss import specopd_step
    from specopd_trainer.algorithms.specopd.sampling import reference_blocks

    assert reference_blocks(torch.tensor([5, 6, 7, 8]), torch.tensor([0, 2]), 3).tolist() == [[6, 7, 8], [8, -1, -1]]
    seen = []
    real = bt.pack_branches
    monkeypatch.setattr(bt, "pack_branches", lambda branches, depth: seen.append(branches.clone()) or
                        real(branches, depth))
    drafter, seqs, scorer = tiny_drafter(), tiny_sequences(2), _Scorer()
    cfg = SpecOPDConfig(anchors_per_seq=4, branches=3, seqs_per_step=2, loss="e2e_fkl_is", reference_branch=0.5)
    loss, m = specopd_step(drafter, scorer, seqs, cfg, torch.Generator().manual_seed(0))
    g = drafter.block_size - 1
    assert torch.isfinite(loss) and m["supervised_tokens"] == 2 * 4 * (3 + 1) * g and len(m["alpha"]) == g
    for s, branches, ref in zip(seqs, seen, scorer.requests[0].references):
        anchors = torch.tensor([t.anchor for t in ref.trees])
        assert branches.shape == (4, 4, g)
        assert torch.equal(branches[:, 3], reference_blocks(s.token_ids, anchors, g).clamp(min=0))
    # lambda changes the loss (the reference term weighs differently from the sampled branches)
    other, _ = specopd_step(drafter, _Scorer(), seqs, cfg.model_copy(update={"reference_branch": 0.9}),
                            torch.Generator().manual_seed(0))
    assert abs(other.item() - loss.item()) > 1e-6
    with pytest.raises(ValueError, match="needs loss e2e_fkl_is"):
        SpecOPDConfig(reference_branch=0.5)


def _hand_root_loss(drafter, s, anchors, roots, branches, pk, hidden, temp: float) -> float:
    """E2E-KL-IS with root anchors for one sequence, by hand from the registry's pieces: slot 1 over branch and root
    anchors (roots weighted by the mean slot-1 weight D of the branch anchors), slots 2..G over the branch anchors.
    ``hidden``: the target rows ``[A + R + nodes, H]`` (branch anchors, roots, tree nodes); the current drafter."""
    from specopd_kernels.losses.e2e_kl import accepted_prefix_weights, draft_accept_ratio
    from specopd_kernels.losses.naive import acceptance_alpha, forward_kl
    from specopd_trainer.loops.head import target_head_logits

    a_n, r_n, k = anchors.numel(), roots.numel(), branches.shape[1]
    g = drafter.block_size - 1
    with torch.no_grad():
        q = drafter.logits(s.features.float(), s.token_ids, anchors)[0][:, 1:]  # [A, G, V]
        q_root = drafter.logits(s.features.float(), s.token_ids, roots)[0][:, 1]  # [R, V]
        p_all = target_head_logits(drafter._head(), hidden, "float32")
    p_tree = torch.cat([p_all[:a_n], p_all[a_n + r_n:]])
    p_b = p_tree[pk.row_index]  # [A*K, G, V]
    q_b = q[:, None].expand(a_n, k, g, q.shape[-1]).reshape(a_n * k, g, -1)
    c = accepted_prefix_weights(acceptance_alpha(p_b, q_b), draft_accept_ratio(p_b, q_b, branches.reshape(a_n * k, g),
                                                                               temp))
    kl = forward_kl(p_b, q_b, reduction="none")  # [A*K, G]
    rest = ((c * kl)[:, 1:].sum(1) / g).view(a_n, k).mean(1)  # [A]
    d = c[:, 0].view(a_n, k).mean(1)  # [A]
    s_anchor = d * kl.view(a_n, k, g)[:, 0, 0] / g
    s_root = d.mean() * forward_kl(p_all[a_n: a_n + r_n], q_root, reduction="none") / g
    return ((s_anchor.sum() + s_root.sum()) / (a_n + r_n) + rest.mean()).item()


def test_root_anchors_estimate_slot_one_over_all_anchors(monkeypatch):
    """With root anchors, the step's loss is slot 1's E2E-KL-IS term averaged over branch AND root anchors (root
    anchors weighted by the mean slot-1 weight D of the branch anchors) plus slots 2..G averaged over the branch
    anchors, recomputed here by hand from the registry's pieces; root anchors are trees without nodes, count one
    supervised token each and get gradient."""
    from specopd_trainer.algorithms.specopd.config import SpecOPDConfig
    from specopd_trainer.algorithms.specopd.loss import specopd_step

    packed = _record_packing(monkeypatch)
    drafter, seqs, scorer = tiny_drafter(), tiny_sequences(2), _Keep()
    outputs = scorer.outputs
    a_n, r_n, k, temp = 3, 4, 4, 0.9
    cfg = SpecOPDConfig(compute_dtype="float32", anchors_per_seq=a_n, root_anchors_per_seq=r_n, branches=k,
                        seqs_per_step=2, temperature=temp, loss="e2e_fkl_is", head_dtype="float32")
    loss, m = specopd_step(drafter, scorer, seqs, cfg, torch.Generator().manual_seed(2))
    g, total = drafter.block_size - 1, 0.0
    for s, (branches, pk), ref, out in zip(seqs, packed, scorer.requests[0].references, outputs):
        trees = ref.trees
        assert [len(t.tokens) > 0 for t in trees] == [True] * a_n + [False] * r_n
        anchors = torch.tensor([t.anchor for t in trees[:a_n]])
        roots = torch.tensor([t.anchor for t in trees[a_n:]])
        assert not set(anchors.tolist()) & set(roots.tolist())
        total += a_n * _hand_root_loss(drafter, s, anchors, roots, branches, pk, out.hidden, temp)
    assert loss.item() == pytest.approx(total / (2 * a_n), rel=1e-4)
    assert m["supervised_tokens"] == 2 * (a_n * k * g + r_n) and m["root_anchors"] == 2 * r_n
    # the root anchors' slot-1 logits get gradient
    drafter.zero_grad()
    loss.backward()
    assert all(p.grad is not None for p in drafter.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="root_anchors_per_seq > 0 needs loss"):
        SpecOPDConfig(root_anchors_per_seq=4)
    with pytest.raises(ValueError, match="cannot be combined"):
        SpecOPDConfig(root_anchors_per_seq=4, loss="e2e_fkl_is", reference_branch=0.5)


def test_minibatches_share_one_scored_batch(monkeypatch):
    """minibatches = 3: ONE score_trees call carries every share's branch trees (minibatch 0, 1, 2), then one
    node-less tree per root anchor not already a branch anchor; branch anchors are disjoint across shares, each
    share has its own root anchors (disjoint from its branch anchors); each share gets exactly its trees' rows;
    each minibatch's loss is the hand-computed E2E-KL-IS with root anchors of the drafter as it is at that
    minibatch (after an update), with gradient."""
    from specopd_trainer.algorithms.specopd.config import SpecOPDConfig
    from specopd_trainer.algorithms.specopd.batch import sample_and_score
    from specopd_trainer.algorithms.specopd.loss import minibatch_loss

    packed = _record_packing(monkeypatch)
    drafter, seqs, scorer = tiny_drafter(), tiny_sequences(2), _Keep()
    a_n, r_n, k, mb, temp = 2, 5, 3, 3, 0.9
    cfg = SpecOPDConfig(compute_dtype="float32", anchors_per_seq=a_n, root_anchors_per_seq=r_n, branches=k,
                        minibatches=mb, temperature=temp, loss="e2e_fkl_is", head_dtype="float32")
    batch = sample_and_score(drafter, scorer, seqs, cfg, torch.Generator().manual_seed(3))
    assert len(scorer.requests) == 1 and len(batch.parts) == mb and all(len(p) == 2 for p in batch.parts)
    for i, (ref, out) in enumerate(zip(scorer.requests[0].references, scorer.outputs)):
        trees, shares = ref.trees, [p[i] for p in batch.parts]
        branch = [a for sh in shares for a in sh.anchors.tolist()]
        roots = sorted({a for sh in shares for a in sh.roots.tolist()} - set(branch))
        assert len(set(branch)) == mb * a_n and [t.anchor for t in trees] == branch + roots
        assert [len(t.tokens) > 0 for t in trees] == [True] * len(branch) + [False] * len(roots)
        row = {t.anchor: j for j, t in reversed(list(enumerate(trees)))}
        node_start = torch.tensor([0] + [len(t.tokens) for t in trees]).cumsum(0) + len(trees)
        for m, sh in enumerate(shares):
            assert sh.anchors.numel() == a_n and sh.roots.numel() == r_n and sh.q is None
            assert not set(sh.roots.tolist()) & set(sh.anchors.tolist())
            tj = [m * a_n + j for j in range(a_n)]
            want = [out.hidden[tj], out.hidden[[row[a] for a in sh.roots.tolist()]]]
            want += [out.hidden[int(node_start[t]): int(node_start[t + 1])] for t in tj]
            assert torch.equal(sh.hidden, torch.cat(want))
    for m in range(mb):
        if m:  # an optimizer step happened: the next minibatch uses the updated drafter
            with torch.no_grad():
                drafter.fc.weight.add_(0.05 * torch.randn_like(drafter.fc.weight))
        want = sum(a_n * _hand_root_loss(drafter, s, sh.anchors, sh.roots, packed[i * mb + m][0], sh.packed,
                                         sh.hidden, temp) for i, (s, sh) in enumerate(zip(seqs, batch.parts[m])))
        loss, met = minibatch_loss(drafter, batch, m, cfg)
        assert loss.item() == pytest.approx(want / (2 * a_n), rel=1e-4)
        assert met["supervised_tokens"] == 2 * (a_n * k * (drafter.block_size - 1) + r_n)
        assert (met["score_s"] > 0) is (m == 0)
        drafter.zero_grad()
        loss.backward()
        assert drafter.fc.weight.grad is not None and drafter.fc.weight.grad.abs().sum() > 0


def test_minibatch_run_scores_once_per_batch_and_resumes_exactly(tmp_path):
    """train_specopd with minibatches = 2: one server call per 2 optimizer steps; checkpoints fall on batch
    boundaries (ckpt_every = 3 -> step 4), so 4 steps + a resume to 6 give the uninterrupted 6-step drafter."""
    from specopd_trainer.algorithms.specopd.config import SpecOPDConfig
    from specopd_trainer.algorithms.specopd.loop import train_specopd

    cfg = SpecOPDConfig(compute_dtype="float32", anchors_per_seq=2, root_anchors_per_seq=2, branches=3, minibatches=2,
                        loss="e2e_fkl_is", steps=6, ckpt_every=3, warmup_steps=0, min_lr_ratio=1.0, lr=1e-2)
    seqs = tiny_sequences(4)
    whole, calls = tiny_drafter(), _HashScorer()
    summary = train_specopd(whole, calls, seqs, tmp_path / "whole", cfg, progress=False)
    assert summary["steps"] == 6 and len(calls.requests) == 3
    assert sorted(p.name for p in (tmp_path / "whole").rglob("step-*.pt")) == ["step-0000004.pt", "step-0000006.pt"]
    part = tiny_drafter()
    train_specopd(part, _HashScorer(), seqs, tmp_path / "split", cfg.model_copy(update={"steps": 4}), progress=False)
    resumed = tiny_drafter()
    again = _HashScorer()
    out = train_specopd(resumed, again, seqs, tmp_path / "split", cfg, progress=False)
    assert out["start_step"] == 4 and len(again.requests) == 1
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name
    assert not torch.equal(whole.fc.weight, tiny_drafter().fc.weight)
