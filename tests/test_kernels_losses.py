"""Loss references (hand cases, brute-force E2E-TV) and fused Triton alpha vs the naive reference.

Triton runs through the interpreter on CPU: the fused kernels are jitted lazily at first call, so the
module fixture below sets TRITON_INTERPRET=1 before any kernel is built (restored afterwards).  On a CUDA
machine the compiled kernels are tested instead.
"""

import itertools
import math

import pytest
import torch

from specopd_kernels.losses import (
    LOSSES,
    acceptance_alpha,
    ce_decay_loss,
    draft_opd_loss,
    e2e_tv_loss,
    expected_acceptance_length,
    forward_kl,
    fused_acceptance_alpha,
    fused_e2e_tv_loss,
    get_loss,
    reverse_kl,
    tv_loss,
)

from support.triton import DEVICE, triton_interpret  # noqa: F401  (module fixture: TRITON_INTERPRET=1 on CPU)


def _logits(probs):
    return torch.tensor(probs, dtype=torch.float64).log().float()


def test_e2e_tv_hand_case_two_tokens():
    # slot 1: p = [.75, .25], q = [.5, .5]  -> alpha1 = min(.75,.5) + min(.25,.5) = .5 + .25 = .75
    # slot 2: p = [.9, .1],   q = [.6, .4]  -> alpha2 = .6 + .1 = .7
    # E[A] = .75 + .75 * .7 = 1.275, tau = 2.275, L = 1 - 1.275 / 2 = 0.3625
    t = _logits([[[0.75, 0.25], [0.9, 0.1]]])
    d = _logits([[[0.5, 0.5], [0.6, 0.4]]]).requires_grad_()
    alpha = acceptance_alpha(t, d)
    assert torch.allclose(alpha, torch.tensor([[0.75, 0.7]]), atol=1e-6)
    ea, tau = expected_acceptance_length(alpha)
    assert ea.item() == pytest.approx(1.275, abs=1e-6) and tau.item() == pytest.approx(2.275, abs=1e-6)
    assert e2e_tv_loss(t, d).item() == pytest.approx(0.3625, abs=1e-6)
    # valid length 1: E[A] = .75, L = 1 - .75 / 2 = .625 (the missing slot is alpha = 0)
    valid = torch.tensor([[True, False]])
    assert e2e_tv_loss(t, d, valid).item() == pytest.approx(0.625, abs=1e-6)
    # d alpha1 / d d_v = q_v (1[q_v < p_v] - c), c = sum_u q_u 1[q_u < p_u] = .5 -> [.5 * .5, .5 * (0 - .5)]
    g, = torch.autograd.grad(alpha[0, 0], d)
    assert torch.allclose(g[0, 0], torch.tensor([0.25, -0.25]), atol=1e-6)
    assert torch.allclose(g[0, 1], torch.zeros(2))


def _brute_force_expected_accepted(p, q):
    """Enumerate every draft path x_1..x_G ~ prod_i q_i(x_i); accept x_k w.p. min(1, p_k/q_k), stop at the
    first rejection; return E[#accepted] exactly."""
    g, v = p.shape
    total = 0.0
    for path in itertools.product(range(v), repeat=g):
        prob_path = math.prod(q[i, x].item() for i, x in enumerate(path))
        survive, accepted = 1.0, 0.0
        for i, x in enumerate(path):
            survive *= min(1.0, p[i, x].item() / q[i, x].item())
            accepted += survive  # P(first i+1 drafts all accepted | path)
        total += prob_path * accepted
    return total


@pytest.mark.parametrize("seed", range(6))
def test_e2e_tv_equals_brute_force_speculative_sampling(seed):
    g_, v = 4, 3
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(2, g_, v, generator=gen, dtype=torch.float64) * 2
    d = torch.randn(2, g_, v, generator=gen, dtype=torch.float64) * 2
    p, q = t.softmax(-1), d.softmax(-1)
    ea, tau = expected_acceptance_length(acceptance_alpha(t, d))
    losses = e2e_tv_loss(t, d, reduction="none")
    for n in range(2):
        bf = _brute_force_expected_accepted(p[n], q[n])
        assert ea[n].item() == pytest.approx(bf, abs=1e-5)
        assert tau[n].item() == pytest.approx(1 + bf, abs=1e-5)
        assert losses[n].item() == pytest.approx(1 - bf / g_, abs=1e-5)
    assert e2e_tv_loss(t, d).item() == pytest.approx(losses.mean().item(), abs=1e-7)
    # valid length 2 of 4: the chain stops after slot 2, still normalised by G = 4
    valid = torch.tensor([[True, True, False, False]] * 2)
    bf0 = _brute_force_expected_accepted(p[0, :2], q[0, :2])
    assert e2e_tv_loss(t, d, valid, reduction="none")[0].item() == pytest.approx(1 - bf0 / g_, abs=1e-5)


def test_tv_and_kl_against_independent_formulas():
    gen = torch.Generator().manual_seed(0)
    t, d = torch.randn(3, 5, 11, generator=gen), torch.randn(3, 5, 11, generator=gen)
    p, q = t.softmax(-1), d.softmax(-1)
    assert torch.allclose(tv_loss(t, d, reduction="none"), 0.5 * (p - q).abs().sum(-1), atol=1e-6)
    fkl = torch.nn.functional.kl_div(q.log(), p, reduction="none").sum(-1)
    rkl = torch.nn.functional.kl_div(p.log(), q, reduction="none").sum(-1)
    assert torch.allclose(forward_kl(t, d, reduction="none"), fkl, atol=1e-5)
    assert torch.allclose(reverse_kl(t, d, reduction="none"), rkl, atol=1e-5)
    mask = torch.rand(3, 5, generator=gen) < 0.5
    assert forward_kl(t, d, mask).item() == pytest.approx(fkl[mask].mean().item(), abs=1e-5)
    assert reverse_kl(t, d, mask, reduction="sum").item() == pytest.approx(rkl[mask].sum().item(), abs=1e-5)
    with pytest.raises(ValueError, match="shape mismatch"):
        tv_loss(t, d[:, :4])
    with pytest.raises(ValueError, match="reduction must be one of"):
        tv_loss(t, d, reduction="avg")
    with pytest.raises(TypeError, match="valid_mask must be a bool tensor"):
        tv_loss(t, d, mask.int())


def test_ce_decay_hand_case():
    # slot 1: logits [0, 0], label 0 -> CE = ln 2;  slot 2: p = [3/4, 1/4], label 1 -> CE = ln 4
    # gamma_decay = 1: w = [1, e^-1];  L = (ln2 + e^-1 ln4) / (1 + e^-1) = 0.8795631685
    logits = torch.stack([_logits([0.5, 0.5]), _logits([0.75, 0.25])])[None]
    labels = torch.tensor([[0, 1]])
    assert ce_decay_loss(logits, labels, gamma_decay=1.0).item() == pytest.approx(0.8795631685, abs=1e-6)
    # gamma 7: w2 = exp(-1/7) = 0.8668779; L = (0.6931472 + 0.8668779 * 1.3862944) / 1.8668779 = 1.0150075
    assert ce_decay_loss(logits, labels).item() == pytest.approx(1.0150075, abs=1e-6)
    # ignored slot 2 -> plain CE of slot 1
    assert ce_decay_loss(logits, torch.tensor([[0, -100]])).item() == pytest.approx(math.log(2), abs=1e-6)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        ce_decay_loss(logits, torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="gamma_decay must be > 0"):
        ce_decay_loss(logits, labels, gamma_decay=0.0)


def test_draft_opd_hand_case_weights_and_clamps():
    # block G = 2: slot 1 accepted, slot 2 rejected; p = [.75, .25], q = [.5, .5] on both slots
    # FKL(p||q) = .75 ln 1.5 + .25 ln .5 = 0.1308120359;  RKL(q||p) = .5 ln(2/3) + .5 ln 2 = 0.1438410362
    # w_2 = 0.8^(2-1) = 0.8 -> L = (0.1308120 + 0.8 * 0.1438410) / (1 + 0.8) = 0.1366027027
    t = torch.stack([_logits([0.75, 0.25])] * 2)[None]
    d = torch.stack([_logits([0.5, 0.5])] * 2)[None]
    acc, rej = torch.tensor([[True, False]]), torch.tensor([[False, True]])
    assert draft_opd_loss(t, d, acc, rej).item() == pytest.approx(0.1366027027, abs=1e-6)
    # lambda_rej = 2: (0.1308120 + 2 * 0.8 * 0.1438410) / (1 + 1.6) = 0.3609577 / 2.6 = 0.1388299
    assert draft_opd_loss(t, d, acc, rej, lambda_rej=2.0).item() == pytest.approx(0.1388299, abs=1e-6)
    # rejected slot 1 only: w_1 = 1 -> plain RKL
    assert draft_opd_loss(t, d, ~acc & ~rej, acc).item() == pytest.approx(0.1438410362, abs=1e-6)
    # log-prob clamp: p = softmax([0, -30]) has log p_2 = -30 -> -10; q = [.5, .5]
    # RKL = .5 (ln .5 - 0) + .5 (ln .5 + 10) = ln .5 + 5 = 4.3068528 (unclamped: 14.30685)
    tc, dc = torch.tensor([[[0.0, -30.0]]]), torch.zeros(1, 1, 2)
    one, none = torch.tensor([[True]]), torch.tensor([[False]])
    assert draft_opd_loss(tc, dc, none, one).item() == pytest.approx(4.3068528, abs=1e-5)
    assert draft_opd_loss(tc, dc, none, one, log_prob_min=None, loss_max=None).item() == pytest.approx(
        14.3068528, abs=1e-4)
    # per-token clamp at 10: q = softmax([-30, 0]), p = softmax([0, -30]) -> RKL ~= 30 -> 10
    far_t, far_d = torch.tensor([[[0.0, -30.0]]]), torch.tensor([[[-30.0, 0.0]]])
    assert draft_opd_loss(far_t, far_d, none, one, log_prob_min=-100.0).item() == pytest.approx(10.0, abs=1e-6)
    assert draft_opd_loss(far_t, far_d, none, one, log_prob_min=-100.0, loss_max=None).item() == pytest.approx(
        30.0, abs=1e-4)
    with pytest.raises(ValueError, match="overlap"):
        draft_opd_loss(t, d, acc, acc)
    with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\]"):
        draft_opd_loss(t, d, acc, rej, gamma=1.5)


def test_registry():
    assert set(LOSSES) == {"ce_decay", "tv", "fkl", "rkl", "e2e_tv", "e2e_tv_fused", "e2e_fkl", "e2e_fkl_is",
                           "draft_opd", "t0_chain_ce"}
    assert get_loss("e2e_tv") is e2e_tv_loss and get_loss("e2e_tv_fused") is fused_e2e_tv_loss
    with pytest.raises(KeyError, match="valid names: ce_decay, draft_opd, e2e_fkl, e2e_fkl_is, e2e_tv, e2e_tv_fused, "
                                       "fkl, rkl, t0_chain_ce, tv"):
        get_loss("kl")


# bf16: both paths compute in fp32 from the same bf16 logits; gradients are rounded to bf16 on output, so
# entries may differ by one bf16 ulp (2^-8 relative): tolerance 2e-2 relative to max |grad|.
TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1e-5, 2e-2)}  # (alpha atol, grad tol rel. to max|g|)
GRID = [(r, v) for r in (1, 3, 17) for v in (7, 128, 1000)] + [(r, v) for r in (1, 2) for v in (49152, 151936)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows, vocab", GRID)
def test_fused_alpha_matches_naive_values_and_grads(rows, vocab, dtype):
    gen = torch.Generator().manual_seed(rows * 100003 + vocab)
    t = (torch.randn(rows, vocab, generator=gen) * 3).to(DEVICE, dtype)
    base = torch.randn(rows, vocab, generator=gen) * 3
    base[:, : vocab // 2] += t[:, : vocab // 2].float().cpu()  # overlapping distributions, alpha well inside (0, 1)
    d = base.to(DEVICE, dtype).requires_grad_()
    w = torch.rand(rows, generator=gen).to(DEVICE)  # non-uniform upstream gradient
    a_f = fused_acceptance_alpha(t, d)
    g_f, = torch.autograd.grad((a_f * w).sum(), d)
    a_n = acceptance_alpha(t, d)
    g_n, = torch.autograd.grad((a_n * w).sum(), d)
    atol, gtol = TOL[dtype]
    assert a_f.dtype == torch.float32 and a_f.shape == (rows,) and g_f.dtype == dtype
    assert torch.allclose(a_f, a_n, atol=atol, rtol=0)
    assert ((g_f.float() - g_n.float()).abs().max() <= gtol * g_n.float().abs().max()).item()
    assert g_n.float().abs().max().item() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_e2e_tv_matches_naive(dtype):
    gen = torch.Generator().manual_seed(7)
    t = torch.randn(5, 3, 300, generator=gen).to(DEVICE, dtype)
    d = (0.5 * t.float().cpu() + torch.randn(5, 3, 300, generator=gen)).to(DEVICE, dtype).requires_grad_()
    valid = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 0, 1]], dtype=torch.bool, device=DEVICE)
    lf = fused_e2e_tv_loss(t, d, valid)
    gf, = torch.autograd.grad(lf, d)
    ln = e2e_tv_loss(t, d, valid)
    gn, = torch.autograd.grad(ln, d)
    assert lf.item() == pytest.approx(ln.item(), abs=1e-5) and 0.0 < lf.item() < 1.0
    gtol = TOL[dtype][1]
    assert ((gf.float() - gn.float()).abs().max() <= gtol * gn.float().abs().max()).item()
    assert gf[3].abs().max().item() == 0.0  # a fully invalid block gets no gradient


def test_fused_input_handling():
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(4, 6, 50, generator=gen, device="cpu").to(DEVICE)
    d = torch.randn(4, 6, 50, generator=gen, device="cpu").to(DEVICE)
    # non-contiguous views and leading dims [..., V]
    a = fused_acceptance_alpha(t.transpose(0, 1), d.transpose(0, 1))
    assert a.shape == (6, 4) and torch.allclose(a, acceptance_alpha(t, d).T, atol=1e-6)
    with pytest.raises(ValueError, match="detach"):
        fused_acceptance_alpha(t.clone().requires_grad_(), d)
    with pytest.raises(TypeError, match="fp32/bf16/fp16"):
        fused_acceptance_alpha(t.double(), d.double())
    with pytest.raises(ValueError, match=r"expected \[N, G, V\]"):
        fused_e2e_tv_loss(t[0], d[0])


def test_fused_without_triton_raises_clear_error(monkeypatch):
    from specopd_kernels.losses import fused

    monkeypatch.setattr(fused, "triton", None)
    with pytest.raises(RuntimeError, match="needs triton"):
        fused_acceptance_alpha(torch.zeros(1, 4), torch.zeros(1, 4))


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU-only error path")
def test_fused_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        fused_acceptance_alpha(torch.zeros(1, 4), torch.zeros(1, 4))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_fused_kernels_compile_for_cuda_sm90(monkeypatch, dtype):
    """No GPU needed: the non-interpreted kernels must lower all the way to a cubin for an H100/H200."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile

    from specopd_kernels.losses import fused

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fwd, bwd = fused._kernels()
    ptr, f32 = f"*{dtype}", "*fp32"
    fwd_sig = dict(T=ptr, D=ptr, ALPHA=f32, LSE_T=f32, LSE_D=f32, C=f32, stride_t="i32", stride_d="i32",
                   V="i32", BLOCK_V="constexpr")
    bwd_sig = dict(T=ptr, D=ptr, GD=ptr, GALPHA=f32, LSE_T=f32, LSE_D=f32, C=f32, stride_t="i32",
                   stride_d="i32", stride_gd="i32", V="i32", BLOCK_V="constexpr")
    for fn, sig, n_reduce in ((fwd, fwd_sig, 6), (bwd, bwd_sig, 0)):
        assert type(fn).__name__ == "JITFunction"
        k = triton_compile(ASTSource(fn=fn, signature=sig, constexprs={"BLOCK_V": 4096}),
                           target=GPUTarget("cuda", 90, 32))
        assert len(k.asm["cubin"]) > 0 and k.asm["ttir"].count('"tt.reduce"') == n_reduce
