"""The regimes of the OPD comparison and the arms run in each (``--regimes`` picks them by letter).

A regime: the drafter architecture, the temperature its traffic is served and judged at, the prompt domains of its
traffic and of its held-out measurement, and the budget the arms are matched on: ``wall`` (every OPD arm trains as
long as continued SFT did, from the same snapshot, wall_s within 15%) or ``traffic`` (every arm sees the same served
requests, the frozen buffer, and trains until its own held-out gain flattens or the step cap).

Arms (each a ``specopd adapt`` adapt step on the snapshot's frozen buffers with the same rehearsal share):
``sft_continued`` (the baseline); ``specopd`` with branches at the serving temperature (at T=0: the argmax block
only, plus the reference branch, the target's greedy path, loss e2e_fkl_is); ``draft_opd`` with
``rejected_slots=first`` on the verify records the snapshot drafter served; ``t0_chain`` (hard CE weighted by the
T=0 argmax-chain acceptance weights, the ``t0_chain_ce`` loss) on the served responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

OLD_DOMAINS = ("dialogue", "coding", "math", "agentic")
SHIFT_DOMAINS = ("japanese", "wordsort")
ARMS = ("sft_continued", "specopd", "draft_opd", "t0_chain")
BASELINE = "sft_continued"
WALL_TOLERANCE = 0.15  # every arm's wall_s within 15% of continued SFT's


@dataclass(frozen=True)
class Regime:
    key: str
    name: str
    arch: str
    temperature: float
    domains: Tuple[str, ...]
    budget: str  # "wall" | "traffic"
    why: str


REGIMES: Tuple[Regime, ...] = (
    Regime("a", "a_dflash_t0", "dflash", 0.0, OLD_DOMAINS, "wall",
           "SFT on the target's greedy path is already on-policy for a DFlash drafter at T=0"),
    Regime("b", "b_dflash_t1", "dflash", 1.0, OLD_DOMAINS, "wall",
           "at T=1 acceptance is sum min(p, q): the sampled-draft objective OPD optimises"),
    Regime("c", "c_dflash2_t1", "dflash2", 1.0, OLD_DOMAINS, "wall",
           "DFlash V2's selector conditions on its own drafts: the papers' argument for OPD"),
    Regime("d", "d_dspark_t1", "dspark", 1.0, OLD_DOMAINS, "wall",
           "DSpark's Markov head conditions on its own drafts"),
    Regime("e", "e_shift_equal_wall", "dflash", 0.0, SHIFT_DOMAINS, "wall",
           "shifted traffic after SFT-from-traffic plateaus, equal wall clock"),
    Regime("e", "e_shift_equal_traffic", "dflash", 0.0, SHIFT_DOMAINS, "traffic",
           "shifted traffic: the same served requests, each arm until its held-out gain flattens (OPD may learn "
           "more per request by drawing branches the target scores)"),
)


class RegimeError(ValueError):
    """A bad --regimes value (one line for the user)."""


def select(text: str) -> List[Regime]:
    """The regimes named by ``text`` (letters a-e, comma-separated; ``all``)."""
    keys = sorted({r.key for r in REGIMES})
    if text.strip() == "all":
        return list(REGIMES)
    want = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in want if k not in keys]
    if bad or not want:
        raise RegimeError(f"--regimes: unknown {bad or text!r}; choose from {','.join(keys)} or all")
    return [r for r in REGIMES if r.key in want]


def arm_setup(arm: str, temperature: float, sizes: Dict[str, int]) -> Tuple[str, Dict[str, Any]]:
    """``(algorithm, its config overrides)`` of ``arm`` at ``temperature``; ``sizes``: seqs / anchors / branches /
    rollout_prompts / max_blocks per step (``--quick`` makes them tiny)."""
    if arm in ("sft_continued", "t0_chain"):  # t0_chain: SFT's sampling, its loss replaced (arms.t0_chain_step)
        return "sft", {"seqs_per_step": sizes["seqs"], "anchors_per_seq": sizes["anchors"]}
    if arm == "specopd":
        base = {"seqs_per_step": sizes["seqs"], "anchors_per_seq": sizes["anchors"], "loss": "e2e_fkl_is"}
        if temperature <= 0:  # the argmax block and the target's greedy path: what a T=0 server verifies
            return "specopd", {**base, "branches": 1, "greedy_branch": True, "reference_branch": 0.5}
        return "specopd", {**base, "branches": sizes["branches"], "temperature": temperature}
    if arm == "draft_opd":
        return "draft-opd", {"rejected_slots": "first", "rollout_prompts": sizes["rollout_prompts"],
                             "max_blocks": sizes["max_blocks"]}
    raise RegimeError(f"unknown arm {arm!r}; arms: {', '.join(ARMS)}")


def within_wall(wall_s: float, baseline_s: float, tolerance: float = WALL_TOLERANCE) -> bool:
    """True when ``wall_s`` is within ``tolerance`` (relative) of the baseline's wall time."""
    return baseline_s > 0 and abs(wall_s - baseline_s) <= tolerance * baseline_s
