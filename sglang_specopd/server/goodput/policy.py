"""The goodput policy's maths: how many of a block's drafts to verify in the next step (issue 42). Pure Python.

A DFlash step drafts ``gamma = block_size - 1`` tokens and verifies ``k`` of them (the target forward runs k + 1
rows per request: the bonus token and k drafts). With per-slot conditional acceptance a_1..a_gamma (a_j: the
probability that draft j is accepted given drafts 1..j-1 were), the step emits in expectation

    E(k) = 1 + sum_{j=1..k} prod_{l<=j} a_l      tokens per request  (E(0) = 1: a plain decode step)

and costs T(k, bs) seconds. The policy picks, per batch, ``argmax_k sum_i E_i(k) / T(k, bs)`` (ties: the smaller
k): expected emitted tokens per second. Every request's verify width is the batch's k (SGLang's verify forward
has one width per batch), so per-request choices apply only to a batch of one.

Acceptance: :class:`SlotEstimate` counts, per slot, verified drafts and accepted ones with exponential forgetting
(half-life in observations). A step that verified k drafts and accepted A observes slots 1..min(A + 1, k) (slots
after the first rejection were not tested). A request's rate for slot j is its own counts shrunk towards the
server-wide estimate: (acc_j + w p_j) / (tried_j + w), p_j = (ACC_j + 2 prior) / (TRIED_j + 2).

Step time: :class:`CostCurve`, per batch-size bucket (1, 2, 3, 4, then powers of two) and k, an exponentially
weighted mean of measured step seconds, made non-decreasing in k (more rows never cost less; a busy machine's noise
is averaged away). Before a bucket's curve is trusted every k is measured
``calibration_steps`` times (``reason`` ``calibrate``); every ``refresh_every`` steps the k measured longest ago
is measured again (``refresh``); after ``explore_every`` consecutive k = 0 steps one k = 1 step refreshes the
acceptance estimate (``explore``). A fixed curve (``cost_curve_ms``) replaces all of that (``given``).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from sglang_specopd.wire.policy import PolicySettings


def expected_tokens(rates: Sequence[float], k: int) -> float:
    """E(k) = 1 + sum_{j<=k} prod_{l<=j} rates[l-1] (rates: per-slot conditional acceptance in [0, 1]).
    Raises ValueError when k < 0 or k > len(rates)."""
    if not 0 <= k <= len(rates):
        raise ValueError(f"k must be in 0..{len(rates)}, got {k}")
    total, run = 1.0, 1.0
    for a in rates[:k]:
        run *= a
        total += run
    return total


def choose_k(rates: Sequence[Sequence[float]], step_s: Sequence[float]) -> int:
    """The k maximising sum_i E_i(k) / step_s[k] over k = 0..len(step_s)-1 (ties: the smaller k).

    Args:
        rates: per request, per-slot conditional acceptance (at least len(step_s) - 1 values each).
        step_s: step time (any positive unit) for k = 0, 1, ...
    Raises:
        ValueError: no request, or a non-positive step time.
    """
    if not rates:
        raise ValueError("no request to choose for")
    if any(not (t > 0) for t in step_s):
        raise ValueError(f"step times must be > 0, got {list(step_s)}")
    best, best_k = -1.0, 0
    for k, t in enumerate(step_s):
        value = sum(expected_tokens(r, k) for r in rates) / t
        if value > best * (1 + 1e-12):
            best, best_k = value, k
    return best_k


def isotonic(values: Sequence[float], weights: Sequence[float]) -> List[float]:
    """The weighted least-squares non-decreasing fit of ``values`` (pool-adjacent-violators): verifying more rows
    never costs less, so noise that says otherwise (a busy machine) is averaged away. Raises ValueError when the
    lengths differ or a weight is not positive."""
    if len(values) != len(weights) or any(not (w > 0) for w in weights):
        raise ValueError("values and positive weights of the same length expected")
    blocks: List[List[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2, c2), (m1, w1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [m for m, _, c in blocks for _ in range(c)]


def bucket_of(bs: int) -> int:
    """Batch-size bucket of the cost curve: 1, 2, 3, 4, then the next power of two (5 -> 8, 9 -> 16)."""
    if bs < 1:
        raise ValueError(f"batch size must be >= 1, got {bs}")
    return bs if bs <= 4 else 1 << (bs - 1).bit_length()


def _decay(half_life: float) -> float:
    return 0.5 ** (1.0 / half_life)


class SlotEstimate:
    """Exponentially forgetting counts of verified (``tried``) and accepted drafts per slot (``gamma`` slots)."""

    def __init__(self, gamma: int, half_life: float):
        self.tried = [0.0] * gamma
        self.accepted = [0.0] * gamma
        self._keep = _decay(half_life)

    def observe(self, verified: int, accepted: int) -> None:
        """One verify step: ``verified`` drafts put to the target, the first ``accepted`` of them accepted.
        Raises ValueError when accepted > verified or verified > gamma."""
        if not 0 <= accepted <= verified <= len(self.tried):
            raise ValueError(f"need 0 <= accepted ({accepted}) <= verified ({verified}) <= {len(self.tried)}")
        if verified == 0:
            return
        keep = self._keep
        self.tried = [t * keep for t in self.tried]
        self.accepted = [a * keep for a in self.accepted]
        for j in range(min(accepted + 1, verified)):
            self.tried[j] += 1.0
            if j < accepted:
                self.accepted[j] += 1.0

    def rates(self, prior: Sequence[float], weight: float) -> List[float]:
        """Per-slot rate (accepted + weight * prior) / (tried + weight)."""
        return [(a + weight * p) / (t + weight) for a, t, p in zip(self.accepted, self.tried, prior)]


class CostCurve:
    """Step seconds per (batch-size bucket, k): measured (EMA) or fixed (``fixed``: {batch size: seconds per k})."""

    def __init__(self, gamma: int, settings: PolicySettings):
        self.gamma, self.settings = gamma, settings
        self._keep = _decay(settings.cost_half_life)
        self.fixed: Optional[Dict[int, List[float]]] = None
        if settings.cost_curve_ms is not None:
            width = len(next(iter(settings.cost_curve_ms.values())))
            if width != gamma + 1:
                raise ValueError(f"cost_curve_ms needs {gamma + 1} values per batch size (k = 0..{gamma}), got {width}")
            self.fixed = {bs: [ms / 1000.0 for ms in v] for bs, v in sorted(settings.cost_curve_ms.items())}
        self.mean: Dict[int, List[Optional[float]]] = {}
        self.count: Dict[int, List[int]] = {}
        self.last: Dict[int, List[int]] = {}
        self.steps: Dict[int, int] = {}

    def _cells(self, bucket: int):
        if bucket not in self.mean:
            n = self.gamma + 1
            self.mean[bucket], self.count[bucket], self.last[bucket] = [None] * n, [0] * n, [-1] * n
            self.steps[bucket] = 0
        return self.mean[bucket], self.count[bucket], self.last[bucket]

    def times(self, bs: int) -> Optional[List[float]]:
        """Seconds per k for a step of ``bs`` requests (None while a k of its bucket was never measured): the fixed
        curve, or the measured means made non-decreasing in k (:func:`isotonic`, weighted by measurements)."""
        if self.fixed is not None:
            below = [b for b in self.fixed if b <= bs]
            return list(self.fixed[max(below) if below else min(self.fixed)])
        mean, count, _ = self._cells(bucket_of(bs))
        if any(m is None for m in mean):
            return None
        cap = 1.0 / (1.0 - self._keep)  # an EMA's effective sample size
        return isotonic(mean, [min(c, cap) for c in count])

    def to_measure(self, bs: int) -> Tuple[Optional[int], str]:
        """(k, reason) when the next step of this batch size should measure a k (``calibrate`` / ``refresh``),
        else (None, "")."""
        if self.fixed is not None:
            return None, ""
        bucket = bucket_of(bs)
        _, count, last = self._cells(bucket)
        need = [k for k in range(self.gamma + 1) if count[k] < self.settings.calibration_steps]
        if need:
            return min(need, key=lambda k: (count[k], k)), "calibrate"
        every = self.settings.refresh_every
        if every and self.steps[bucket] % every == every - 1:
            return min(range(self.gamma + 1), key=lambda k: (last[k], k)), "refresh"
        return None, ""

    def observe(self, bs: int, k: int, seconds: float) -> None:
        """One measured step of ``bs`` requests that verified ``k`` drafts (no-op for a fixed curve)."""
        if self.fixed is not None or not (seconds > 0) or not math.isfinite(seconds):
            return
        bucket = bucket_of(bs)
        mean, count, last = self._cells(bucket)
        self.steps[bucket] += 1
        last[k] = self.steps[bucket]
        count[k] += 1
        if mean[k] is None:
            mean[k] = seconds
        else:  # the first measurements weigh equally, then the EMA takes over
            w = max(1.0 - self._keep, 1.0 / count[k])
            mean[k] += w * (seconds - mean[k])

    def table_ms(self) -> Dict[int, List[Optional[float]]]:
        """{bucket (fixed: batch size): ms per k, None where not measured}."""
        src = self.fixed if self.fixed is not None else self.mean
        return {b: [None if s is None else s * 1000.0 for s in v] for b, v in sorted(src.items())}

    def fit_ms(self) -> Dict[int, Optional[List[float]]]:
        """{bucket: the ms per k :meth:`times` gives (None while a k is unmeasured)}."""
        src = self.fixed if self.fixed is not None else self.mean
        out = {}
        for b in sorted(src):
            t = self.times(b)
            out[b] = None if t is None else [x * 1000.0 for x in t]
        return out


def request_class(temperature: float, top_k: int) -> str:
    """A request's class for the acceptance estimates: ``greedy`` (temperature 0 or top-k 1; SGLang stores
    temperature 0 as top_k = 1) or ``sampled``. Drafts of the two are accepted at very different rates."""
    return "greedy" if top_k == 1 or temperature <= 1e-6 else "sampled"


class GoodputPolicy:
    """The per-server state: the server-wide and per-class slot estimates, the cost curve, the exploration counters.

    Request classes (:func:`request_class`; ``None``: one class): each class has its own slot estimate (half-life
    ``class_half_life``, shrunk towards the server-wide one) that its requests' estimates are shrunk towards, and its
    own run of consecutive k = 0 steps. So a class whose drafts stop paying (sampled traffic at low acceptance)
    turns speculation off (k = 0, a plain decode step) for its batches while the other keeps drafting, and after
    ``explore_every`` k = 0 steps of a class its next batch verifies one draft (``explore``): as acceptance
    recovers the class's estimate rises and speculation comes back on. A hot swap forgets every estimate."""

    def __init__(self, gamma: int, settings: PolicySettings):
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        self.gamma, self.settings = gamma, settings
        self.costs = CostCurve(gamma, settings)
        self.reset_acceptance()

    def reset_acceptance(self) -> None:
        """Forget the server-wide and per-class acceptance (a new drafter); the cost curve stays."""
        self.glob = SlotEstimate(self.gamma, self.settings.global_half_life)
        self.classes: Dict[str, SlotEstimate] = {}
        self._zero_run: Dict[str, int] = {}

    def new_request_estimate(self) -> SlotEstimate:
        """A request's own estimate (attach it to the request; pass it to :meth:`plan` and :meth:`observe`)."""
        return SlotEstimate(self.gamma, self.settings.request_half_life)

    def prior(self, cls: Optional[str] = None) -> List[float]:
        """Per-slot rates: server-wide (Beta prior of weight 2 at ``prior_accept``), or of class ``cls`` (its
        counts shrunk towards the server-wide rates with weight 2)."""
        glob = self.glob.rates([self.settings.prior_accept] * self.gamma, 2.0)
        est = self.classes.get(cls) if cls is not None else None
        return glob if est is None else est.rates(glob, 2.0)

    def class_acceptance(self) -> Dict[str, List[float]]:
        """{class: :meth:`prior` of the class} for every class seen since the last reset."""
        return {c: self.prior(c) for c in sorted(self.classes)}

    def plan(self, estimates: Sequence[SlotEstimate], classes: Optional[Sequence[str]] = None) -> Tuple[int, str]:
        """(k, reason) for the next step of a batch whose requests have these estimates (and classes)."""
        bs = len(estimates)
        if self.settings.policy == "fixed":
            return self.gamma, "fixed"
        classes = list(classes) if classes is not None else ["all"] * bs
        k, reason = self.costs.to_measure(bs)
        if k is None:
            times = self.costs.times(bs)
            priors = {c: self.prior(c) for c in set(classes)}
            rates = [e.rates(priors[c], self.settings.prior_weight) for e, c in zip(estimates, classes)]
            k = choose_k(rates, times) if times is not None else self.gamma
            reason = "given" if self.costs.fixed is not None else "goodput"
            every = self.settings.explore_every
            if k == 0 and every and any(self._zero_run.get(c, 0) >= every for c in classes):
                k, reason = 1, "explore"
        for c in set(classes):
            self._zero_run[c] = self._zero_run.get(c, 0) + 1 if k == 0 else 0
        return k, reason

    def observe(self, estimates: Sequence[SlotEstimate], verified: int, accepted: Sequence[int],
                classes: Optional[Sequence[str]] = None) -> None:
        """The verify outcome: ``verified`` drafts per request, ``accepted[i]`` of request i accepted."""
        classes = list(classes) if classes is not None else ["all"] * len(estimates)
        for est, acc, c in zip(estimates, accepted, classes):
            acc = min(int(acc), verified)
            est.observe(verified, acc)
            self.glob.observe(verified, acc)
            if c not in self.classes:
                self.classes[c] = SlotEstimate(self.gamma, self.settings.class_half_life)
            self.classes[c].observe(verified, acc)
