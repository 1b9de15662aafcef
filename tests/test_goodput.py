"""The goodput policy's maths (sglang_specopd.server.goodput.policy) and the truncated acceptance of a narrowed step
(sglang_specopd.server.goodput.verify.accept_narrow), without a server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_specopd.server.goodput.policy import (CostCurve, GoodputPolicy, SlotEstimate, bucket_of, choose_k,
                                                  expected_tokens, request_class)
from sglang_specopd.wire.policy import PolicySettings, PolicyStats, policy_env


def test_expected_tokens_hand_values() -> None:
    rates = [0.5, 0.5, 0.5]
    assert [expected_tokens(rates, k) for k in range(4)] == [1.0, 1.5, 1.75, 1.875]
    assert expected_tokens([0.9, 0.0, 1.0], 3) == pytest.approx(1.9)  # nothing after a slot that always fails
    with pytest.raises(ValueError):
        expected_tokens(rates, 4)


def test_choose_k_follows_the_cost_curve() -> None:
    rates = [[0.8, 0.6, 0.5]]
    # E = 1, 1.8, 2.28, 2.52; on a curve like the 1-thread CPU one (1-4 rows: 84, 83, ~104, 124 ms) plus a
    # 30 ms drafter from k = 1 on: tokens/ms 0.0119, 0.0159, 0.0170, 0.0164 -> k = 2
    cpu_like = [84.0, 113.0, 134.0, 154.0]
    assert choose_k(rates, cpu_like) == 2
    assert choose_k(rates, [84.0, 113.0, 160.0, 200.0]) == 1  # 0.0159 > 0.0143, 0.0126
    # a curve on which speculation never pays: k = 0 (a plain decode step)
    assert choose_k(rates, [1.0, 3.0, 3.0, 3.0]) == 0
    # free verification: the whole block
    assert choose_k(rates, [1.0, 1.0, 1.0, 1.0]) == 3
    # ties go to the smaller k; a batch sums its requests
    assert choose_k([[0.0, 0.0, 0.0]], [1.0, 1.0, 1.0, 1.0]) == 0
    assert choose_k([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [1.0, 1.4, 9.0, 9.0]) == 1  # 3 / 1.4 > 2 / 1
    with pytest.raises(ValueError):
        choose_k([], [1.0])


def test_isotonic_cost_fit() -> None:
    from sglang_specopd.server.goodput.policy import isotonic

    assert isotonic([1.0, 2.0, 3.0], [1, 1, 1]) == [1.0, 2.0, 3.0]
    assert isotonic([1.0, 3.0, 2.0], [1, 1, 1]) == [1.0, 2.5, 2.5]
    assert isotonic([1.0, 3.0, 2.0], [1, 1, 3]) == pytest.approx([1.0, 2.25, 2.25])
    # the goodput policy's calibration on a busy machine (ms for k = 0..7): noise pooled into a monotone curve
    noisy = [254.0, 350.0, 447.0, 349.0, 601.0, 300.0, 604.0, 434.0]
    fit = isotonic(noisy, [2] * 8)
    assert fit == pytest.approx([254.0, 350.0, 398.0, 398.0, 450.5, 450.5, 519.0, 519.0])
    assert all(a <= b for a, b in zip(fit, fit[1:]))


def test_bucket_of() -> None:
    assert [bucket_of(b) for b in (1, 2, 3, 4, 5, 8, 9, 17)] == [1, 2, 3, 4, 8, 8, 16, 32]


def test_slot_estimate_counts_only_tested_slots() -> None:
    est = SlotEstimate(4, half_life=1e9)  # no forgetting
    est.observe(verified=3, accepted=1)  # slot 1 accepted, slot 2 rejected, slot 3 never tested
    assert est.tried == pytest.approx([1, 1, 0, 0]) and est.accepted == pytest.approx([1, 0, 0, 0])
    est.observe(verified=2, accepted=2)  # both verified slots accepted; slot 3 not verified
    assert est.tried == pytest.approx([2, 2, 0, 0]) and est.accepted == pytest.approx([2, 1, 0, 0])
    est.observe(verified=0, accepted=0)  # a plain decode step tells nothing
    assert est.tried == pytest.approx([2, 2, 0, 0])
    assert est.rates([0.5] * 4, weight=2.0) == pytest.approx([3 / 4, 2 / 4, 0.5, 0.5])
    with pytest.raises(ValueError):
        est.observe(verified=2, accepted=3)


def test_slot_estimate_forgets_with_its_half_life() -> None:
    est = SlotEstimate(1, half_life=1.0)
    est.observe(1, 1)
    est.observe(1, 0)  # the first observation now weighs 1/2
    assert est.tried == pytest.approx([1.5]) and est.accepted == pytest.approx([0.5])


def test_cost_curve_calibrates_every_k_then_refreshes_the_stalest() -> None:
    curve = CostCurve(2, PolicySettings(policy="goodput", calibration_steps=2, refresh_every=4))
    seen = []
    for step in range(6):
        k, why = curve.to_measure(1)
        assert why == "calibrate"
        seen.append(k)
        curve.observe(1, k, 0.1 * (k + 1))
    assert sorted(seen) == [0, 0, 1, 1, 2, 2] and seen[:3] == [0, 1, 2]
    assert curve.times(1) == pytest.approx([0.1, 0.2, 0.3]) and curve.times(2) is None  # another bucket
    curve.observe(1, 1, 0.2)  # 7 steps in the bucket: the next (8th) is a refresh of the k measured longest ago
    assert curve.to_measure(1) == (0, "refresh")  # k = 0 was last measured at step 4
    curve.observe(1, 2, 0.6)  # the EMA moves towards new measurements
    assert 0.3 < curve.times(1)[2] < 0.6
    assert curve.table_ms()[1][0] == pytest.approx(100.0)
    assert curve.fit_ms()[1] == pytest.approx([1000.0 * t for t in curve.times(1)])


def test_fixed_curve_is_used_as_given() -> None:
    s = PolicySettings(policy="goodput", cost_curve_ms={1: [10.0, 30.0, 30.0], 4: [20.0, 21.0, 22.0]})
    curve = CostCurve(2, s)
    assert curve.to_measure(1) == (None, "")
    assert curve.times(1) == pytest.approx([0.01, 0.03, 0.03]) and curve.times(3) == pytest.approx([0.01, 0.03, 0.03])
    assert curve.times(9) == pytest.approx([0.02, 0.021, 0.022])
    curve.observe(1, 0, 5.0)  # no online measuring
    assert curve.times(1)[0] == pytest.approx(0.01)
    with pytest.raises(ValueError, match="3 values"):
        CostCurve(2, PolicySettings(policy="goodput", cost_curve_ms={1: [1.0, 2.0]}))


def test_policy_with_a_curve_that_makes_k0_optimal_plans_plain_steps_and_explores() -> None:
    s = PolicySettings(policy="goodput", cost_curve_ms={1: [1.0, 3.0, 3.0, 3.0]}, explore_every=4)
    pol = GoodputPolicy(3, s)
    ests = [pol.new_request_estimate()]
    plans = [pol.plan(ests) for _ in range(10)]
    assert plans[:4] == [(0, "given")] * 4 and plans[4] == (1, "explore") and plans[5:9] == [(0, "given")] * 4
    assert plans[9] == (1, "explore")
    never = GoodputPolicy(3, s.model_copy(update={"explore_every": 0}))
    assert {never.plan(ests) for _ in range(50)} == {(0, "given")}


def test_policy_learns_acceptance_and_the_fixed_policy_verifies_the_block() -> None:
    s = PolicySettings(policy="goodput", cost_curve_ms={1: [84.0, 113.0, 134.0, 154.0]}, prior_accept=0.1)
    pol = GoodputPolicy(3, s)
    ests = [pol.new_request_estimate()]
    assert pol.plan(ests) == (0, "given")  # prior 0.1: speculation does not pay
    for _ in range(200):
        pol.observe(ests, 3, [3])  # every draft accepted
    assert pol.prior() == pytest.approx([1.0, 1.0, 1.0], abs=0.02)
    assert pol.plan(ests) == (3, "given")
    pol.reset_acceptance()
    assert pol.prior() == pytest.approx([0.1] * 3)
    assert GoodputPolicy(3, PolicySettings()).plan(ests) == (3, "fixed")


def test_speculation_switches_off_and_on_per_request_class() -> None:
    """Issue 53: falling acceptance turns k to 0 for that request class only; exploration keeps testing it, and
    rising acceptance turns it back on; a hot swap starts every class again."""
    assert request_class(1.0, 1) == "greedy" and request_class(0.0, -1) == "greedy"
    assert request_class(0.7, -1) == "sampled" and request_class(1.0, 50) == "sampled"
    # one draft pays when slot 1 is accepted more than 1 time in 4: (1 + a) / 12.5 > 1 / 10
    s = PolicySettings(policy="goodput", cost_curve_ms={1: [10.0, 12.5, 100.0, 100.0]}, explore_every=4,
                       prior_weight=1.0, class_half_life=8.0, request_half_life=4.0)
    pol = GoodputPolicy(3, s)

    def serve(cls: str, accept: bool, steps: int, per_request: int = 5):
        """Requests of ``cls`` one after another (``per_request`` steps each); (k, reason) of every step."""
        plans = []
        for i in range(steps):
            if i % per_request == 0:
                est = pol.new_request_estimate()
            k, reason = pol.plan([est], [cls])
            plans.append((k, reason))
            if k:
                pol.observe([est], k, [k if accept else 0], [cls])
        return plans

    fresh = pol.new_request_estimate
    assert pol.plan([fresh()], ["greedy"]) == pol.plan([fresh()], ["sampled"]) == (1, "given")  # prior 0.5: on
    serve("greedy", True, 30)
    falling = serve("sampled", False, 30)
    assert falling[0] == (1, "given") and (0, "given") in falling  # sampled drafts stop paying: k = 0
    assert pol.prior("sampled")[0] < 0.25 < 0.9 < pol.prior("greedy")[0]
    assert pol.plan([fresh()], ["sampled"]) != (1, "given")  # a new sampled request starts off (or explores) ...
    assert pol.plan([fresh()], ["greedy"]) == (1, "given")  # ... a greedy one on
    off = serve("sampled", False, 40)  # still bad: off, but one draft verified after every 4 k = 0 steps
    assert {p for p in off} == {(0, "given"), (1, "explore")} and off.count((1, "explore")) >= 6
    assert pol.plan([fresh()], ["greedy"]) == (1, "given")
    rising = serve("sampled", True, 120)  # acceptance recovers (an adapter push without a swap): back on
    on_at = next(i for i, p in enumerate(rising) if p == (1, "given"))
    assert rising[on_at:][-20:] == [(1, "given")] * 20 and pol.plan([fresh()], ["sampled"]) == (1, "given")
    assert (0, "given") in rising[:on_at]  # it came back through exploration, not at once
    serve("sampled", False, 30)
    pol.reset_acceptance()  # a hot swap: the new drafter's acceptance is unknown, every class starts on
    assert pol.plan([fresh()], ["sampled"]) == (1, "given") and pol.class_acceptance() == {}
    stats_classes = GoodputPolicy(3, s)
    stats_classes.observe([fresh(), fresh()], 1, [1, 0], ["greedy", "sampled"])
    assert set(stats_classes.class_acceptance()) == {"greedy", "sampled"}


def test_policy_settings_validation_and_env() -> None:
    with pytest.raises(ValueError):
        PolicySettings(policy="goodput", cost_curve_ms={1: [1.0], 2: [1.0, 2.0]})
    with pytest.raises(ValueError):
        PolicySettings(policy="goodput", cost_curve_ms={1: [0.0, 2.0]})
    with pytest.raises(ValueError):
        PolicySettings(policy="sometimes")
    env = policy_env("goodput")
    assert PolicySettings.model_validate_json(next(iter(env.values()))).policy == "goodput"
    from sglang_specopd.server.goodput.step import settings_from_env

    assert settings_from_env({}).policy == "fixed"
    with pytest.raises(ValueError, match="SPECOPD_SPECULATIVE_POLICY"):
        settings_from_env({"SPECOPD_SPECULATIVE_POLICY": '{"policy": "always"}'})
    stats = PolicyStats(settings=PolicySettings(), gamma=3, steps=0, k_histogram={0: 0}, reasons={},
                        cost_curve_ms={1: [None, 2.0]}, slot_acceptance=[0.5],
                        breakdown={"steps": 0})
    assert PolicyStats.model_validate_json(stats.model_dump_json()) == stats


# --- the truncated acceptance of a step that verifies k < B - 1 drafts ---

def _step(k: int, block: int = 4):
    from sglang_specopd.server.goodput.verify import StepState

    return StepState(k=k, block=block, reason="test", batch=None, device="cpu", draft_hidden=8)


def test_accept_narrow_greedy_stops_at_k_with_the_target_bonus() -> None:
    pytest.importorskip("sglang")
    from sglang_specopd.server.goodput.verify import accept_narrow

    vocab, block = 12, 4
    cand = torch.tensor([[5, 7, 8, 9]])
    predict = [7, 8, 9, 2]  # the target agrees with every draft
    logits = torch.full((block, vocab), -5.0)
    for j, t in enumerate(predict):
        logits[j, t] = 5.0
    for k, (acc, bonus) in enumerate([(0, 7), (1, 8), (2, 9), (3, 2)]):
        out = accept_narrow(_step(k), candidates=cand, next_token_logits=logits, sampling_info=None,
                            draft_input=None, prefix_lens=None, bs=1)
        assert (out[0].tolist(), out[2].tolist(), out[1].tolist()) == ([acc], [bonus], [acc + 1]), k
        assert out[3][0, : acc + 1].tolist() == predict[: acc + 1] and out[4] is None
    # rows past the verified ones are padding: garbage there changes nothing
    logits[2:] = torch.randn(2, vocab)
    out = accept_narrow(_step(1), candidates=cand, next_token_logits=logits, sampling_info=None, draft_input=None,
                        target_predict=None)
    assert (out[0].tolist(), out[2].tolist()) == ([1], [8])
    # SGLang's argmax ids path (target_predict [bs * B])
    out = accept_narrow(_step(2), candidates=cand, next_token_logits=None, sampling_info=None, draft_input=None,
                        target_predict=torch.tensor([7, 8, 3, 0]))
    assert (out[0].tolist(), out[2].tolist()) == ([2], [3])


def test_accept_narrow_sampled_is_lossless_for_the_verified_prefix() -> None:
    """Sampled drafts, k = 1 of 3: the first emitted token follows p_0, and when the draft is accepted the bonus
    follows p_1 itself (a full-block verify would draw it from the residual after testing draft 2)."""
    pytest.importorskip("sglang")
    from sglang_specopd.server.cpu.chain_sampling import install
    from sglang_specopd.server.goodput.verify import accept_narrow

    install()
    torch.manual_seed(0)
    n, vocab, block = 20000, 4, 4
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.25] * 4, [0.25] * 4])  # rows 0..3
    q = torch.tensor([[0.2, 0.5, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7], [0.25] * 4])  # draft slots 1..3
    drafts = torch.stack([torch.multinomial(q[j], n, replacement=True) for j in range(3)], dim=1)
    cand = torch.cat([torch.zeros(n, 1, dtype=torch.long), drafts], dim=1)
    logits = p.log().repeat(n, 1)
    info = SimpleNamespace(need_top_k_sampling=False, need_top_p_sampling=False, temperatures=torch.ones(n, 1),
                           is_all_greedy=False)
    acc, _, bonus, out_tokens, _ = accept_narrow(
        _step(1), candidates=cand, next_token_logits=logits, sampling_info=info, q=q.expand(n, 3, vocab),
        draft_input=SimpleNamespace(max_top_k=None, uniform_top_k_value=None))
    assert set(acc.tolist()) <= {0, 1}
    first = torch.bincount(out_tokens[:, 0], minlength=vocab).float() / n
    assert torch.allclose(first, p[0], atol=0.015), first
    accepted = acc == 1
    assert abs(accepted.float().mean().item() - torch.minimum(p[0], q[0]).sum().item()) < 0.015
    second = torch.bincount(bonus[accepted], minlength=vocab).float() / int(accepted.sum())
    assert torch.allclose(second, p[1], atol=0.02), second
