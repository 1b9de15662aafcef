"""Pieces shared by the training loops: LR schedule, distributed setup, anchor sampling, offline tau."""

from __future__ import annotations

import math
import os
from typing import List, Sequence, Tuple

import torch


def lr_at(step: int, *, base_lr: float, warmup_steps: int, total_steps: int, min_ratio: float = 0.1) -> float:
    """Linear warmup to ``base_lr`` over ``warmup_steps``, then cosine decay to ``min_ratio * base_lr``."""
    if step < warmup_steps:
        return base_lr * (step + 1) / max(1, warmup_steps)
    t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def dist_info() -> Tuple[int, int]:
    """(rank, world_size); initialises torch.distributed when run under torchrun: gloo without CUDA, gloo for CPU
    tensors + nccl for CUDA tensors with it (:func:`specopd_trainer.loops.parallel.backend`)."""
    import torch.distributed as dist

    from specopd_trainer.loops.parallel import backend

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        if not dist.is_initialized():
            dist.init_process_group(backend())
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def step_generator(seed: int, step: int, rank: int) -> torch.Generator:
    """The RNG of one training step on one rank: a pure function of (seed, step, rank), so resume is exact."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 64 + rank)


def sample_anchors(prompt_len: int, length: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` distinct anchors (long, sorted) uniformly among response positions ``prompt_len-1 .. length-2``.

    The anchor is the last verified token, so anchor ``prompt_len - 1`` predicts the first response token; every
    anchor has at least one label (``a + 1 < length``). Fewer are returned when the response is short.
    """
    lo, hi = max(0, prompt_len - 1), length - 2
    if hi < lo:
        return torch.empty(0, dtype=torch.long)
    span = hi - lo + 1
    pick = torch.randperm(span, generator=gen)[: min(n, span)] + lo
    return pick.sort().values


@torch.no_grad()
def greedy_walk_tau(drafter, token_ids: torch.Tensor, features: torch.Tensor, prompt_len: int,
                    chunk: int = 64) -> Tuple[float, int, int]:
    """Greedy acceptance of ``drafter`` against a target greedy response, without a server.

    Walk: the first anchor is the first response token (position ``prompt_len``: it is the bonus token of the
    prefill); accepted = leading drafted slots equal to the target's tokens; advance by accepted + 1. Returns
    (tau, emitted tokens, verify steps) with tau = emitted / steps. Proposals for all anchors come from one
    training-mask forward per ``chunk`` anchors (exactly the serving computation).
    """
    L = int(token_ids.shape[0])
    anchors = list(range(prompt_len, L - 1))
    if not anchors:
        return float("nan"), 0, 0
    props = {}
    for i in range(0, len(anchors), chunk):
        part = anchors[i : i + chunk]
        out = drafter.propose_blocks(features, token_ids, part)
        for a, row in zip(part, out.tolist()):
            props[a] = row
    a, emitted, steps = prompt_len, 0, 0
    tokens = token_ids.tolist()
    while a < L - 1:
        acc = 0
        for k, t in enumerate(props[a], start=1):
            if a + k >= L or t != tokens[a + k]:
                break
            acc += 1
        step = min(acc + 1, L - 1 - a)
        emitted += step
        steps += 1
        a += acc + 1
    return emitted / steps, emitted, steps


def mean_walk_tau(drafter, sequences: Sequence, limit: int = 16) -> float:
    """Pooled greedy-walk tau (sum emitted / sum steps) over up to ``limit`` sequences."""
    em = st = 0
    for s in list(sequences)[:limit]:
        _, e, n = greedy_walk_tau(drafter, s.token_ids, s.features.float(), s.prompt_len)
        em, st = em + e, st + n
    return em / st if st else float("nan")


def select(seqs: List, idx: torch.Tensor) -> List:
    return [seqs[int(i)] for i in idx]
