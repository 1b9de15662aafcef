"""The arms of the Draft-OPD comparison, their selection, and the configs that give each the same budget.

Budget: target-scored (supervised) draft tokens, the unit of ``benchmarks/specopd_smollm2/run.py``. Per optimiser step
an arm supervises (G = block_size - 1 draft slots per block):
  sft_continued       8 sequences x 16 anchors x G labelled slots (exact: :func:`continued_sft_config`);
  specopd             seqs x (anchors x branches x G + root anchors) (exact: :func:`specopd_config`, the recipe);
  draft_opd*          at most ``max_blocks`` replayed blocks x G slots (every slot of a replayed block is scored:
                      accepted ones by forward KL, rejected ones by reverse KL; the no-replay ablation labels the
                      same G slots with the rollout text), so ceil(budget / (max_blocks x G)) steps when the
                      rollouts hold at least ``max_blocks`` selectable blocks per step;
  draft_opd_first_rejection  draft_opd's step count (:data:`EQUAL_STEPS_ARMS`: the same rollouts and target
                      scoring, fewer supervised slots), no budget stop and no top-ups;
  sequential_opd      verify records x G; records per step ~ rollout_prompts x rollout_tokens / tau, estimated at
                      the start's served T1 tau (``sft_start``'s evaluation; ``SEQUENTIAL_TAU`` before it is
                      measured): the schedule length; the run stops as soon as the budget is reached.
The rollout arms stop at the first step that starts with the budget reached, and a run that ends below it (fewer
tokens per step than planned) is resumed for the steps the rest needs at its observed rate, up to
``train.MAX_TOPUPS`` times (:mod:`.train`); what each arm really supervised is recorded (``supervised_tokens``,
``budget_fraction``: at least 1, less than one step over, unless the top-ups ran out).
"""

from __future__ import annotations

import math
from typing import Dict, List, Sequence

START = "sft_start"
BASELINE = "sft_continued"
# every arm, in the order they run (the baseline first after the start, so paired differences are ready early)
ARMS = ("sft_start", "sft_continued", "draft_opd", "specopd", "sequential_opd", "draft_opd_no_replay",
        "draft_opd_fkl_only", "draft_opd_rkl_only", "draft_opd_random_anchors", "draft_opd_first_rejection")
# Draft-OPD arms: the overrides of DraftOPDConfig (the flags of `specopd train draft-opd`) each one trains with
DRAFT_OPD_ARMS: Dict[str, Dict[str, object]] = {
    "draft_opd": {},
    "draft_opd_no_replay": {"replay": False},
    "draft_opd_fkl_only": {"loss": "fkl_only"},
    "draft_opd_rkl_only": {"loss": "rkl_only"},
    "draft_opd_random_anchors": {"anchors": "random"},
    "draft_opd_first_rejection": {"rejected_slots": "first"},
}
# arms that run the step count of another arm instead of the token budget: draft_opd_first_rejection rolls out,
# replays and has the target score exactly what draft_opd does (equal target compute) but supervises only the
# accepted slots and the first rejected one, so a token budget would give it ~4x draft_opd's rollouts
EQUAL_STEPS_ARMS: Dict[str, str] = {"draft_opd_first_rejection": "draft_opd"}
SEQUENTIAL_TAU = 1.2  # served tau assumed for the sequential arm's step count (as benchmarks/specopd_smollm2/run.py)


class ArmsError(ValueError):
    """A bad ``--arms`` value (the message is one line for the user)."""


def select_names(text: str | None, valid: Sequence[str], option: str, error: type = ArmsError) -> List[str]:
    """The names of ``valid`` named in ``text`` (comma-separated; None, "" or "all": every one), in ``valid``'s
    order, each once. Raises ``error`` (one line: ``option``, the unknown names, the valid ones)."""
    if text is None or text.strip() in ("", "all"):
        return list(valid)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise error(f"{option}: unknown {', '.join(unknown) or '(none given)'}; valid: {', '.join(valid)}")
    return [a for a in valid if a in names]


def select_arms(text: str | None) -> List[str]:
    """The arms named in ``text`` (comma-separated; None, "" or "all": every arm), in :data:`ARMS` order, each
    once. Raises :class:`ArmsError` naming unknown arms and listing the valid ones."""
    return select_names(text, ARMS, "--arms")


def draft_opd_steps(budget_tokens: int, g: int, max_blocks: int) -> int:
    """Steps of a Draft-OPD arm: ceil(budget / (max_blocks x G)), at least 1 (full steps supervise max_blocks x G
    tokens; the last one may pass the budget by less than one step)."""
    return max(1, math.ceil(budget_tokens / (max_blocks * g)))


def sequential_steps(budget_tokens: int, g: int, rollout_prompts: int, rollout_tokens: int,
                     tau: float = SEQUENTIAL_TAU) -> int:
    """Schedule length of the sequential arm: budget / (prompts x tokens / tau x G) steps, rounded, at least 1."""
    return max(1, round(budget_tokens / (rollout_prompts * rollout_tokens / tau * g)))


def draft_opd_config(arm: str, budget_tokens: int, g: int, *, rollout_prompts: int, rollout_tokens: int,
                     max_blocks: int, lr: float, temperature: float = 1.0):
    """The DraftOPDConfig of Draft-OPD ``arm`` (its ablation flags of :data:`DRAFT_OPD_ARMS`), pushing every step
    (on-policy rollouts), as many steps as :func:`draft_opd_steps` gives, no mid-run checkpoints. Raises KeyError
    for an arm that is not a Draft-OPD arm."""
    from specopd_trainer.algorithms.draft_opd.config import DraftOPDConfig

    return DraftOPDConfig(steps=draft_opd_steps(budget_tokens, g, max_blocks), rollout_prompts=rollout_prompts,
                          rollout_tokens=rollout_tokens, concurrency=rollout_prompts, temperature=temperature,
                          max_blocks=max_blocks, lr=lr, push_every=1, ckpt_every=10**6, log_every=1,
                          **DRAFT_OPD_ARMS[arm])


def sequential_config(budget_tokens: int, g: int, *, rollout_prompts: int, rollout_tokens: int, lr: float,
                      tau: float = SEQUENTIAL_TAU):
    """The SequentialOPDConfig of the sequential arm (T=1 rollouts, :func:`sequential_steps` steps at served
    ``tau``: the start's measured T1 tau when the script has it)."""
    from specopd_trainer.algorithms.sequential_opd.config import SequentialOPDConfig

    return SequentialOPDConfig(steps=sequential_steps(budget_tokens, g, rollout_prompts, rollout_tokens, tau),
                               rollout_prompts=rollout_prompts, rollout_tokens=rollout_tokens,
                               concurrency=rollout_prompts, temperature=1.0, lr=lr, ckpt_every=10**6, log_every=1)


def specopd_recipe_config(budget_tokens: int, g: int, lr: float | None = None):
    """The SpecOPD arm: the validated recipe of the registry (``specopd_trainer.algorithms.specopd.RECIPE``: 2
    sequences x (8 anchors x 7 branches + 64 root anchors), E2E-KL with accepted-prefix weights, LR 1e-3) at the
    budget, through ``benchmarks/specopd_smollm2.specopd_config`` (its step count for the same budget)."""
    from specopd_smollm2.run import specopd_config
    from specopd_trainer.algorithms.specopd import RECIPE

    return specopd_config(budget_tokens, g, anchors_per_seq=RECIPE["anchors_per_seq"], branches=RECIPE["branches"],
                          seqs_per_step=RECIPE["seqs_per_step"], lr=lr or RECIPE["lr"], loss=RECIPE["loss"],
                          root_anchors=RECIPE["root_anchors_per_seq"])


def budget_fraction(tokens: int, budget_tokens: int) -> float:
    """Supervised tokens of an arm over the budget (1.0 = exactly the budget)."""
    return tokens / budget_tokens if budget_tokens else 0.0

