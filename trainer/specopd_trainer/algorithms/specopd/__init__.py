"""SpecOPD: branch-parallel on-policy distillation with the E2E-TV surrogate of acceptance length.

One step (SpecOPD paper; formulas in the shared algorithm notes):
1. drafter forward at ``anchors_per_seq`` reference anchors of each sequence (training mask, all anchors at once)
   -> per anchor the drafter's q (``drafter.slot_q``, :mod:`specopd_trainer.drafters.slot_q`; G = block_size - 1
   slots): DFlash drafts every slot in parallel (slot i's q does not depend on the tokens sampled at slots < i);
   DFlash V2 and DSpark draft left to right (slot i's q is conditioned on the branch's own tokens before it);
2. K branches per anchor sampled from q at ``temperature`` (no gradient; slot by slot for V2 / DSpark), the
   drafter's own proposals; with ``greedy_branch`` branch 0 is the block the served drafter proposes at T=0;
3. ONE ``/specopd/score_trees`` call for the whole step: every branch of every anchor packed into proposal trees
   sharing the reference prefix, branches that share leading tokens sharing tree nodes (a trie per anchor); the
   target's final hidden states come back and the trainer applies the frozen target LM head, giving p_1 (anchor
   row) and p_{i+1} (row of branch token i) on the branch's own history;
4. loss E2E-TV: L = 1 - (1/G) sum_j prod_{i<=j} alpha_i, alpha_i = sum_v min(p_i(v), q_i(v)), per branch, mean
   (q_i on the branch's own history for V2 / DSpark: one q row per tree row).
Only the first G-1 sampled tokens of a branch are scored (the last token's row would predict beyond the block).
No sequential draft-and-verify rollout is needed. With ``minibatches`` > 1 one scored batch (steps 1-3 for
``minibatches`` times the anchors) feeds that many optimizer steps. Any loss of the loss registry with a tree form
(:func:`specopd_kernels.losses.tree_losses`) can replace E2E-TV.

Modules, in import order: :mod:`.config` (:class:`SpecOPDConfig`), :mod:`.sampling` (drafter forward, branches),
:mod:`.batch` (one scored batch: sample + ONE server call), :mod:`.loss` (minibatch loss, :func:`specopd_step`),
:mod:`.loop` (:func:`train_specopd` on the engine), :mod:`.run` (the registry's run).
"""

from __future__ import annotations

from specopd_trainer.algorithms.registry import Algorithm, lazy_adapt, lazy_run, register
from specopd_trainer.algorithms.specopd.config import SpecOPDConfig

# The validated setting (README "Using it"; benchmarks/results/specopd_sweep_is_smollm2_cpu.json, the main job):
# E2E-KL with accepted-prefix weights, 2 references x 8 anchors x 7 branches + 64 root anchors per step, LR 1e-3.
RECIPE = {
    "steps": 256,
    "seqs_per_step": 2,
    "anchors_per_seq": 8,
    "branches": 7,
    "root_anchors_per_seq": 64,
    "loss": "e2e_fkl_is",
    "lr": 1e-3,
    "warmup_steps": 2,
    "log_every": 1,
    "push_every": 32,
}



ALGORITHM = register(Algorithm(
    name="specopd",
    title="SpecOPD",
    help="SpecOPD: K branches per anchor sampled from the drafter, scored by the server in ONE tree call per step.\n\n"
         "Loss from the loss registry (default: the validated recipe, E2E-KL with accepted-prefix weights); the "
         "drafter is pushed hot every --push-every steps and at the end. Runs under `torchrun` as DDP (each rank "
         "samples its own sequences) or FSDP2 (--parallel fsdp2: drafter sharded, the step's sequences split "
         "across ranks); rank 0 pushes.",
    config=SpecOPDConfig,
    run=lazy_run("specopd_trainer.algorithms.specopd.run:run"),
    recipe=RECIPE,
    data="sequences",
    flags={"anchors_per_seq": "--anchors", "root_anchors_per_seq": "--root-anchors", "warmup_steps": "--warmup"},
    adapt=lazy_adapt("specopd_trainer.algorithms.specopd.adapt:make_step"),
))

__all__ = ["ALGORITHM", "RECIPE", "SpecOPDConfig"]
