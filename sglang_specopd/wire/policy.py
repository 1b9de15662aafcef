"""Wire models of the speculative policy (issue 42): how many drafted tokens the SPECOPD worker verifies per step.

``speculative_policy: fixed`` (SGLang's DFlash behaviour: every step verifies the whole block of
``block_size - 1`` drafts) or ``goodput`` (before each verify the worker picks k in 0..block_size-1 drafts to
verify, maximising expected emitted tokens per second of step time; :mod:`sglang_specopd.server.goodput.policy`). The
server config's ``speculative_policy`` reaches every server process as :data:`POLICY_ENV` (JSON of
:class:`PolicySettings`); ``GET /specopd/policy`` returns :class:`PolicyStats`, and ``POST /specopd/policy``
(admin key) replaces the settings of a running server (its estimates start again). Strict pydantic models.
"""

from __future__ import annotations

from typing import Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

POLICY_PATH = "/specopd/policy"  # GET: PolicyStats; POST (admin): PolicySettings JSON
POLICY_ENV = "SPECOPD_SPECULATIVE_POLICY"  # JSON of PolicySettings, set by the launcher
VERIFY_K_KEY = "specopd_verify_k"  # meta_info: the number of drafts verified at each verify step of the request

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


class PolicySettings(BaseModel):
    """The policy and its knobs (all optional but ``policy``).

    Attributes:
        policy: ``fixed`` (verify the whole block) or ``goodput``.
        cost_curve_ms: a FIXED cost curve instead of the measured one: batch size -> step time in ms for
            k = 0 .. block_size-1 (one value per k; the batch size nearest below a step's is used, else the
            smallest). No online measuring when given (tests; GPU configs with a curve measured offline).
        calibration_steps: steps measured per (batch-size bucket, k) before the measured curve is trusted.
        refresh_every: every that many steps of a bucket, the k measured longest ago is measured again (0: never).
        explore_every: after that many consecutive k = 0 steps, one k = 1 step refreshes the acceptance estimate
            (0: never).
        prior_accept: conditional acceptance assumed for a slot before any observation (0..1).
        prior_weight: pseudo-observations of the server-wide estimate in each request's estimate.
        request_half_life: verify observations after which a request's old observations weigh half.
        global_half_life: the same for the server-wide estimate.
        class_half_life: the same for a request class's estimate (greedy / sampled; server/goodput/policy.py).
        cost_half_life: measurements after which an old step-time measurement weighs half.
        plain_k0: a k = 0 step runs as SGLang's plain decode (no verify layout, no drafter K/V write; the drafter's
            context is caught up when drafting resumes: server/goodput/plain.py); false: through the verify path
            with one row per request (the behaviour before issue 53, kept for A/B measurements).
        catch_up_every: with ``plain_k0``, a plain step after which a request holds that many positions without
            drafter context catches its batch up in the same step (bounds the hidden states kept per request).
    """

    model_config = _STRICT

    policy: Literal["fixed", "goodput"] = "fixed"
    cost_curve_ms: Optional[Dict[int, List[float]]] = None
    calibration_steps: int = Field(default=2, ge=1, le=64)
    refresh_every: int = Field(default=64, ge=0)
    explore_every: int = Field(default=32, ge=0)
    prior_accept: float = Field(default=0.5, ge=0.0, le=1.0)
    prior_weight: float = Field(default=4.0, gt=0.0)
    request_half_life: float = Field(default=16.0, gt=0.0)
    global_half_life: float = Field(default=512.0, gt=0.0)
    class_half_life: float = Field(default=64.0, gt=0.0)
    cost_half_life: float = Field(default=16.0, gt=0.0)
    plain_k0: bool = True
    catch_up_every: int = Field(default=64, ge=1)

    @field_validator("cost_curve_ms")
    @classmethod
    def _curve(cls, v):
        if v is None:
            return v
        if not v:
            raise ValueError("cost_curve_ms must name at least one batch size")
        lengths = {len(ms) for ms in v.values()}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError("cost_curve_ms needs the same number (>= 1) of values per batch size")
        for bs, ms in v.items():
            if bs < 1 or any(not (x > 0) for x in ms):
                raise ValueError(f"cost_curve_ms[{bs}]: batch sizes >= 1 and step times > 0 ms, got {ms}")
        return v


class StepBreakdown(BaseModel):
    """Mean ms per decode step of each part (``other``: the step minus both forwards, plus the scheduler time
    between two decode steps), over ``steps`` decode steps; ``verify_rows``: mean target rows per request per step
    (k + 1; 1 is a plain decode step)."""

    model_config = _STRICT

    steps: int
    verify_rows: Optional[float] = None
    step: Optional[float] = None
    target_forward: Optional[float] = None
    drafter_forward: Optional[float] = None
    other: Optional[float] = None


class PolicyStats(BaseModel):
    """``GET /specopd/policy``: the serving policy and what it did since it started (or was last set).

    ``k_histogram``: {k: decode steps that verified k drafts}; ``reasons``: {why k was chosen: steps} (``fixed``,
    ``goodput``, ``calibrate``, ``refresh``, ``explore``, ``given``: a fixed cost curve); ``cost_curve_ms``:
    {batch-size bucket: ms per k (None: not measured)}, ``cost_curve_fit_ms`` the curve the policy uses (made
    non-decreasing in k; None until every k of the bucket was measured); ``slot_acceptance``: the server-wide estimate of each
    slot's acceptance given the slots before it were accepted; ``unsupported``: why this worker verifies whole
    blocks whatever the policy (None when it can apply it); ``plain_steps``: k = 0 steps run as SGLang's plain decode,
    ``context_catch_up``: drafter-context positions those steps left and later steps wrote in batched passes;
    ``class_acceptance``: the slot acceptance of each request class (``greedy``, ``sampled``) seen since the last reset."""

    model_config = _STRICT

    settings: PolicySettings
    gamma: int
    steps: int
    k_histogram: Dict[int, int]
    reasons: Dict[str, int]
    cost_curve_ms: Dict[int, List[Optional[float]]]
    cost_curve_fit_ms: Dict[int, Optional[List[float]]] = {}
    slot_acceptance: List[float]
    breakdown: StepBreakdown
    unsupported: Optional[str] = None
    plain_steps: int = 0
    class_acceptance: Dict[str, List[float]] = {}
    context_catch_up: int = 0


def policy_env(policy: str) -> dict:
    """The environment that carries a server config's ``speculative_policy`` (``fixed`` | ``goodput``, default
    settings) to the server's processes: {:data:`POLICY_ENV`: PolicySettings JSON}."""
    return {POLICY_ENV: PolicySettings(policy=policy).model_dump_json()}
