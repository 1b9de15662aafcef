"""Every drafter architecture through the proposal-tree training path (``drafter.slot_q``).

DFlash drafts every slot in parallel; DFlash V2 (candidate selector) and DSpark (Markov head) draft left to right, so
a slot's q depends on the tokens sampled before it in the block. On tiny random drafters with a 6-token vocabulary
and block 4 (3 drafted slots, 6^3 = 216 blocks): the E2E-TV surrogate computed through proposal trees equals, in
value and gradient, brute-force enumeration over every block with each block's own conditional q (teacher-forced
``conditional_logits``, an independent code path) and a fixed target p per (anchor, prefix); branch sampling draws
blocks with the conditional q's probabilities; one SFT, SpecOPD and Draft-OPD step per architecture gives a finite
loss against stand-in scorers.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from _sft_fixture import ARCHS, tiny_drafter, tiny_sequences
from sglang_specopd.wire.drafters.dflash2 import DFlash2Spec
from sglang_specopd.wire.drafters.dspark import DSparkSpec
from sglang_specopd.wire.drafters.format import DrafterSpec
from specopd_trainer.drafters.dflash import DFlashDrafter
from specopd_trainer.drafters.dflash2 import DFlash2Drafter
from specopd_trainer.drafters.dspark import DSparkDrafter
from specopd_trainer.drafters.target_head import TargetHead
from specopd_trainer.loops.branch_tree import pack_branches

V, H, B = 6, 16, 4
G = B - 1
BASE = dict(hidden_size=H, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
            intermediate_size=32, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=V, max_position_embeddings=64,
            block_size=B, target_layer_ids=(1,), mask_token="<m>", mask_token_id=5, num_target_layers=4)
KINDS = {
    "dflash": lambda: DFlashDrafter(DrafterSpec(**BASE)),
    "dflash2": lambda: DFlash2Drafter(DFlash2Spec(**BASE, conv_group_size=8, selector_rank=3, selector_top_k=4,
                                                  output_multiplier=1.5, final_logit_softcapping=4.0)),
    "dspark-gated": lambda: DSparkDrafter(DSparkSpec(**BASE, markov_rank=3, markov_head_type="gated")),
    "dspark-rnn": lambda: DSparkDrafter(DSparkSpec(**BASE, markov_rank=3, markov_head_type="rnn",
                                                   sample_from_anchor=False)),
}
ANCHORS = torch.tensor([2, 6])
BLOCKS = torch.tensor(list(itertools.product(range(V), repeat=G)))  # [216, G], every in-block token sequence


def make(kind: str, seed: int = 3):
    """A tiny drafter whose every tensor is random and O(1) (conv kernels identity + noise), on a random head small
    enough that q is not a point mass."""
    g = torch.Generator().manual_seed(seed)
    d = KINDS[kind]()
    d.target_head = TargetHead(0.3 * torch.randn(V, H, generator=g), 0.3 * torch.randn(V, H, generator=g))
    sd = {}
    for n, t in d.state_dict().items():
        noise = (1.5 if "markov_w2" in n else 0.5) * torch.randn(t.shape, generator=g)  # a strong Markov bias
        sd[n] = t + noise if n.endswith(("norm.weight", "base_kernel")) else noise
    d.load_state_dict(sd)
    tokens = torch.randint(0, V - 1, (9,), generator=g)
    return d, tokens, torch.randn(9, H, generator=g)


def chi_square(counts: torch.Tensor, prob: torch.Tensor) -> tuple[float, float]:
    """Pearson's chi-square of block ``counts [N]`` against the law ``prob [N]``, cells with an expected count
    below 5 pooled into one (so the chi-square approximation holds), and its 1 - 1e-4 quantile (Wilson-Hilferty).

    With a fixed seed the test is deterministic; a correct sampler exceeds the limit with probability 1e-4 per
    anchor. A per-cell 5-sigma bound is not used: with counts of a few units its normal approximation is poor."""
    n = counts.sum()
    expected = n * prob
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    z = 3.719  # standard normal 1 - 1e-4 quantile
    return stat, df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def target_logits(anchor: int, prefix: tuple) -> torch.Tensor:
    """The fixed target p (logits ``[V]``) after the branch tokens ``prefix`` at ``anchor``."""
    code = sum((t + 1) * (V + 1) ** i for i, t in enumerate(prefix))
    return 2.0 * torch.randn(V, generator=torch.Generator().manual_seed(1000 * anchor + code))


def conditional_q(d, tokens, feats, blocks: torch.Tensor) -> torch.Tensor:
    """Brute force: each block's own q logits ``[A, N, G, V]`` for ``blocks [N, G]`` at every anchor (DFlash: the
    training logits, the same for every block; V2 / DSpark: teacher-forced on the block)."""
    if isinstance(d, (DFlash2Drafter, DSparkDrafter)):
        hidden, _, anchor = d.slot_hidden(feats, tokens, ANCHORS)
        n = blocks.shape[0]
        return torch.stack([d.conditional_logits(hidden[j].expand(n, -1, -1), anchor[j].expand(n), blocks)
                            for j in range(len(ANCHORS))])
    q = d.logits(feats, tokens, ANCHORS)[0][:, 1:].float()  # [A, G, V]
    return q[:, None].expand(-1, blocks.shape[0], -1, -1)


def tree_rows(pk, anchors) -> torch.Tensor:
    """Target logits of every tree row from the trie's tokens and parents (not from ``row_path``)."""
    rows = [target_logits(int(a), ()) for a in anchors]
    for a, toks, parents in zip(anchors.tolist(), pk.tokens, pk.parents):
        prefix = []
        for t, par in zip(toks, parents):
            prefix.append((prefix[par] if par >= 0 else ()) + (t,))
            rows.append(target_logits(a, prefix[-1]))
    return torch.stack(rows)


@pytest.mark.parametrize("kind", list(KINDS))
def test_tree_e2e_tv_equals_enumeration_value_and_gradient(kind: str) -> None:
    """All 216 blocks at each of 2 anchors packed into proposal trees: ``tree_loss('e2e_tv')`` on
    ``slot_q(...).tree_logits`` = mean over blocks of 1 - (1/G) sum_j prod_{i<=j} alpha_i with alpha_i =
    sum_v min(p_i(v | y_<i), q_i(v | y_<i)), enumerated by hand; same gradient for every drafter parameter."""
    from specopd_kernels.losses import tree_loss

    d, tokens, feats = make(kind)
    branches = BLOCKS[None].expand(len(ANCHORS), -1, -1)
    pk = pack_branches(branches, G - 1)
    draft, row_draft = d.slot_q(feats, tokens, ANCHORS).tree_logits(pk.row_anchor, pk.row_slot, pk.row_path)
    got = tree_loss("e2e_tv", tree_rows(pk, ANCHORS), draft, row_draft, pk.row_index)
    got_grads = torch.autograd.grad(got, list(d.parameters()), allow_unused=True)

    q = torch.softmax(conditional_q(d, tokens, feats, BLOCKS), dim=-1)  # [A, N, G, V]
    p = torch.softmax(torch.stack([torch.stack([torch.stack([target_logits(int(a), tuple(y[:i].tolist()))
                                                             for i in range(G)]) for y in BLOCKS])
                                   for a in ANCHORS]), dim=-1)
    alpha = torch.minimum(p, q).sum(-1)  # [A, N, G]
    want = (1 - alpha.cumprod(-1).mean(-1)).mean()
    want_grads = torch.autograd.grad(want, list(d.parameters()), allow_unused=True)
    assert got.item() == pytest.approx(want.item(), abs=1e-6)
    assert 0.05 < want.item() < 0.95  # not degenerate
    for (name, _), a, b in zip(d.named_parameters(), got_grads, want_grads):
        a = torch.zeros(1) if a is None else a
        b = torch.zeros(1) if b is None else b
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4), name
    moved = [n for (n, _), gr in zip(d.named_parameters(), got_grads) if gr is not None and gr.abs().sum() > 0]
    head = {"dflash2": "candidate_selector.successor_codebook", "dspark-rnn": "markov_head.joint_proj.weight",
            "dspark-gated": "markov_head.gate_proj.weight"}.get(kind, "fc.weight")
    assert head in moved


@pytest.mark.parametrize("kind", list(KINDS))
def test_branch_sampling_frequencies_match_the_conditional_q(kind: str) -> None:
    """``slot_q(...).sample`` draws whole blocks with probability prod_k q_k(y_k | y_<k) at temperature T; the
    E2E-TV tree loss on those sampled branches estimates its q-weighted expectation; ``greedy()`` is the served
    temperature-0 block."""
    from specopd_kernels.losses import tree_loss

    d, tokens, feats = make(kind, seed=4)
    temp, n = 0.8, 20000
    with torch.no_grad():
        sq = d.slot_q(feats, tokens, ANCHORS)
        drawn = sq.sample(n, temp, torch.Generator().manual_seed(0))  # [A, n, G]
        logq = torch.log_softmax(conditional_q(d, tokens, feats, BLOCKS) / temp, dim=-1)  # [A, 216, G, V]
        prob = logq.gather(-1, BLOCKS[None, :, :, None].expand(len(ANCHORS), -1, -1, 1))[..., 0].sum(-1).exp()
        assert torch.allclose(prob.sum(-1), torch.ones(len(ANCHORS)), atol=1e-5)
        index = (drawn * torch.tensor([V * V, V, 1])).sum(-1)  # [A, n] block ids in BLOCKS order
        counts = torch.stack([torch.bincount(i, minlength=len(BLOCKS)) for i in index]).double()
        for j in range(len(ANCHORS)):
            stat, limit = chi_square(counts[j], prob[j].double())
            assert stat < limit, (j, stat, limit)
            if kind != "dflash":  # a sampler ignoring earlier tokens (product of per-slot marginals) fails by far
                marg = [prob[j].view([V] * G).sum([x for x in range(G) if x != i]) for i in range(G)]
                indep = torch.stack([marg[i][BLOCKS[:, i]] for i in range(G)]).prod(0).double()
                assert chi_square(n * indep, prob[j].double())[0] > 2 * limit  # its noncentrality
        assert torch.equal(sq.greedy(), d.propose_blocks(feats, tokens, ANCHORS))

    # the tree loss on the sampled branches (trie-packed) estimates E_{y ~ q}[L(y)], enumerated by hand
    sq = d.slot_q(feats, tokens, ANCHORS)
    k = 4000
    branches = sq.sample(k, 1.0, torch.Generator().manual_seed(1))
    pk = pack_branches(branches, G - 1)
    draft, row_draft = sq.tree_logits(pk.row_anchor, pk.row_slot, pk.row_path)
    with torch.no_grad():
        est = tree_loss("e2e_tv", tree_rows(pk, ANCHORS), draft, row_draft, pk.row_index).item()
        q = torch.softmax(conditional_q(d, tokens, feats, BLOCKS), dim=-1)  # [A, 216, G, V]
        p = torch.softmax(torch.stack([torch.stack([torch.stack([target_logits(int(a), tuple(y[:i].tolist()))
                                                                 for i in range(G)]) for y in BLOCKS])
                                       for a in ANCHORS]), dim=-1)
        per_block = 1 - torch.minimum(p, q).sum(-1).cumprod(-1).mean(-1)  # [A, 216]
        weight = q.gather(-1, BLOCKS[None, :, :, None].expand(len(ANCHORS), -1, -1, 1))[..., 0].prod(-1)
        want = (weight * per_block).sum(-1).mean().item()
    # per-block losses lie in [0, 1] (sd <= 0.5): the mean of 2 x 4000 draws is within 5 sd / sqrt(8000) = 0.028
    assert abs(est - want) < 5 * 0.5 / math.sqrt(len(ANCHORS) * k)


def test_row_logits_equal_teacher_forced_conditionals() -> None:
    """``ConditionalSlotQ.row_logits`` (unary + path_bias, one row per (anchor, slot, path)) equals slot s of
    ``conditional_logits`` teacher-forced on the same path, for every semi-autoregressive kind and slot."""
    for kind in ("dflash2", "dspark-gated", "dspark-rnn"):
        d, tokens, feats = make(kind, seed=5)
        with torch.no_grad():
            sq = d.slot_q(feats, tokens, ANCHORS)
            full = conditional_q(d, tokens, feats, BLOCKS)  # [A, 216, G, V]
            rows_a = torch.arange(len(ANCHORS)).repeat_interleave(len(BLOCKS) * G)
            rows_s = torch.arange(G).repeat(len(ANCHORS) * len(BLOCKS))
            paths = BLOCKS.repeat_interleave(G, dim=0).repeat(len(ANCHORS), 1)
            got = sq.row_logits(rows_a, rows_s, paths).view(len(ANCHORS), len(BLOCKS), G, V)
            assert torch.allclose(got, full, atol=1e-5), kind


# ----------------------------------------------------------------------- one training step per architecture

@pytest.mark.parametrize("arch", ARCHS)
def test_sft_step_for_each_architecture(arch: str, tmp_path) -> None:
    from specopd_trainer.algorithms.sft.config import SFTConfig
    from specopd_trainer.algorithms.sft.loop import train_sft

    d = tiny_drafter(arch=arch)
    before = [p.detach().clone() for p in d.parameters()]
    out = train_sft(d, tiny_sequences(2), [], tmp_path / "run", SFTConfig(steps=2, seqs_per_step=2, anchors_per_seq=4,
                    log_every=1, ckpt_every=10, warmup_steps=0, lr=1e-2), progress=False)
    assert out["steps"] == 2 and math.isfinite(out["loss"]) and out["loss"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, d.parameters()))


@pytest.mark.parametrize("arch", ARCHS)
def test_specopd_step_for_each_architecture(arch: str, monkeypatch) -> None:
    """One SpecOPD step (E2E-KL-IS, root anchors, the greedy branch) with a stand-in scorer: finite loss equal to the
    registry's flat loss on the expanded branches with each branch's own q (teacher-forced conditionals for V2 /
    DSpark), gradient into the architecture's head."""
    from fakes.scorers import KeepScorer as _Keep
    from fakes.scorers import record_packing as _record_packing

    from specopd_kernels.losses import get_loss
    from specopd_trainer.algorithms.specopd.config import SpecOPDConfig
    from specopd_trainer.algorithms.specopd.loss import specopd_step
    from specopd_trainer.loops.head import target_head_logits

    packed = _record_packing(monkeypatch)
    d, seqs, scorer = tiny_drafter(arch=arch), tiny_sequences(2), _Keep()
    cfg = SpecOPDConfig(compute_dtype="float32", anchors_per_seq=3, branches=4, seqs_per_step=2, temperature=0.9,
                        loss="e2e_fkl_is", head_dtype="float32", greedy_branch=True)
    loss, m = specopd_step(d, scorer, seqs, cfg, torch.Generator().manual_seed(0))
    assert torch.isfinite(loss) and loss.item() > 0 and m["supervised_tokens"] == 2 * 3 * 4 * G
    total = 0.0
    for s, (branches, pk), ref, out in zip(seqs, packed, scorer.requests[0].references, scorer.outputs):
        anchors = torch.tensor([t.anchor for t in ref.trees])
        a, k = branches.shape[:2]
        flat = branches.reshape(a * k, G)
        with torch.no_grad():
            if arch == "dflash":
                q = d.logits(s.features.float(), s.token_ids, anchors)[0][:, 1:]
                q = q[:, None].expand(a, k, G, q.shape[-1]).reshape(a * k, G, -1)
            else:
                hidden, _, anchor_tokens = d.slot_hidden(s.features.float(), s.token_ids, anchors)
                q = d.conditional_logits(hidden.repeat_interleave(k, 0), anchor_tokens.repeat_interleave(k), flat)
            assert torch.equal(branches[:, 0], d.propose_blocks(s.features.float(), s.token_ids, anchors))
            p_rows = target_head_logits(d._head(), out.hidden, "float32")
        total += get_loss("e2e_fkl_is")(p_rows[pk.row_index], q, flat, 0.9).item() * a
    assert loss.item() == pytest.approx(total / 6, rel=1e-4)
    loss.backward()
    head = {"dflash2": "candidate_selector.successor_codebook", "dspark": "markov_head.joint_proj.weight"}
    grad = d.get_parameter(head.get(arch, "fc.weight")).grad
    assert grad is not None and grad.abs().sum() > 0
    # root anchors (slot 1 at extra anchors), several minibatches and a bf16 autocast forward also run
    cfg2 = cfg.model_copy(update={"root_anchors_per_seq": 3, "greedy_branch": False, "minibatches": 2,
                                  "compute_dtype": "bfloat16"})
    from specopd_trainer.algorithms.specopd.batch import sample_and_score
    from specopd_trainer.algorithms.specopd.loss import minibatch_loss

    batch = sample_and_score(d, scorer, seqs, cfg2, torch.Generator().manual_seed(1))
    for part in range(2):
        value, _ = minibatch_loss(d, batch, part, cfg2)
        assert torch.isfinite(value)
        value.backward()


@pytest.mark.parametrize("arch", ARCHS)
def test_draft_opd_step_for_each_architecture(arch: str, tmp_path) -> None:
    from fakes.draft_opd import PROMPTS, FakeServer, draft_opd_config as _cfg, pusher as _pusher

    from specopd_trainer.algorithms.draft_opd.loop import train_draft_opd

    server = FakeServer()
    out = train_draft_opd(tiny_drafter(arch=arch), server, PROMPTS, tmp_path / "r", _cfg(steps=1),
                          push=_pusher(server, []), progress=False)
    assert out["steps"] == 1 and math.isfinite(out["loss"]) and out["metrics"]["rejected_tokens"] > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_sequential_opd_rollout_step_for_each_architecture(arch: str) -> None:
    """Sequential OPD's loss on recorded blocks (each a one-branch tree of its proposed tokens) runs for every
    architecture: finite, with gradient."""
    from fakes.draft_opd import PROMPTS, FakeServer

    from specopd_trainer.algorithms.sequential_opd.rollouts import Rollout, rollout_step

    server, d = FakeServer(), tiny_drafter(arch=arch)
    rollouts = []
    for p in PROMPTS:
        out = server.generate(p, max_new_tokens=12, trace=True)
        rollouts.append(Rollout(list(p) + out["output_ids"], len(p), out["meta_info"]["specopd_trace"]))
    loss, m = rollout_step(d, server, rollouts, list(d.spec.target_layer_ids), head_dtype="float32")
    assert torch.isfinite(loss) and m["records"] > 0
    loss.backward()
    assert d.fc.weight.grad is not None and d.fc.weight.grad.abs().sum() > 0
