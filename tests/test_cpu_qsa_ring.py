"""The two-group QSA index-key ring (server/cpu/qsa_ring.py, adaptation 14): simulated prefill + speculative verify
forwards, every group compressed from exactly its own members' keys; SGLang's one-group ring is not."""

from __future__ import annotations

import random

import pytest
import torch

from sglang_specopd.server.cpu.qsa_ring import group_ring_slots, pending_ring_slots


def _run(builders, ratio: int, window: int, prompt: int, steps: int, seed: int) -> list:
    """Store one request's index keys through ``builders`` (pending, group) over a prefill of ``prompt`` tokens and
    ``steps`` verify forwards of ``window`` rows with random acceptance; returns the groups (end position) whose
    ring slots held other positions' keys when the group was compressed."""
    pending, group = builders
    rng, req = random.Random(seed), torch.tensor([3])  # request slot 3 (0 is the dump)
    ring, bad = {}, []

    def forward(positions: list, is_extend: bool, length: int) -> None:
        pos = torch.tensor(positions)
        slots = pending(token_to_batch_idx=torch.zeros(len(positions), dtype=torch.long), req_pool_indices=req,
                        sequence_lengths=torch.tensor([length]), logical_positions=pos, compress_ratio=ratio,
                        is_extend=is_extend)
        for p, s in zip(positions, slots.tolist()):  # every row is stored before any group is compressed
            ring[s] = p
        ends = [p for p in positions if p % ratio == ratio - 1]
        if is_extend:
            return  # extend compresses from the forward's own rows (SGLang's member_rows), not the ring
        if ends:
            members = group(req_pool_indices=req, group_end_positions=torch.tensor(ends),
                            sequence_ids=torch.zeros(len(ends), dtype=torch.long), compress_ratio=ratio)
            for e, row in zip(ends, members.tolist()):
                if [ring.get(s) for s in row] != list(range(e - ratio + 1, e + 1)):
                    bad.append(e)

    forward(list(range(prompt)), True, prompt)
    start = prompt
    for _ in range(steps):
        forward(list(range(start, start + window)), False, start + window)
        start += rng.randint(1, window)  # accepted drafts + the bonus token: the next anchor's position
    return bad


@pytest.mark.parametrize("ratio,window", [(2, 1), (2, 2), (4, 1), (4, 3), (4, 4), (8, 5), (8, 8)])
@pytest.mark.parametrize("prompt", [1, 7, 30, 33])
def test_two_group_ring_compresses_every_group_from_its_own_keys(ratio, window, prompt) -> None:
    assert _run((pending_ring_slots, group_ring_slots), ratio, window, prompt, steps=40, seed=prompt + ratio) == []


def test_sglangs_one_group_ring_loses_members_when_a_verify_straddles_a_group_end() -> None:
    from sglang.srt.layers.attention.qsa.metadata import build_group_ring_slots, build_pending_ring_slots

    bad = _run((build_pending_ring_slots, build_group_ring_slots), 4, 4, 90, steps=40, seed=1)
    assert bad, "expected SGLang's ring to compress some group from overwritten keys"
    # decoding one token per forward never straddles: the one-group ring is exact there
    assert _run((build_pending_ring_slots, build_group_ring_slots), 4, 1, 90, steps=40, seed=1) == []


def test_slot_layout() -> None:
    slots = pending_ring_slots(token_to_batch_idx=torch.tensor([0, 0, 1]), req_pool_indices=torch.tensor([2, 5]),
                               sequence_lengths=torch.tensor([9, 9]), logical_positions=torch.tensor([6, 9, 15]),
                               compress_ratio=4, is_extend=False)
    assert slots.tolist() == [2 * 8 + 6, 2 * 8 + 1, 5 * 8 + 7]
    members = group_ring_slots(req_pool_indices=torch.tensor([2]), group_end_positions=torch.tensor([11]),
                               sequence_ids=torch.tensor([0]), compress_ratio=4)
    assert members.tolist() == [[16 + 0, 16 + 1, 16 + 2, 16 + 3]]  # positions 8..11 -> % 8
    dump = pending_ring_slots(token_to_batch_idx=torch.zeros(3, dtype=torch.long), req_pool_indices=torch.tensor([2]),
                              sequence_lengths=torch.tensor([10]), logical_positions=torch.tensor([3, 7, 9]),
                              compress_ratio=4, is_extend=True)
    assert dump.tolist() == [3, 7, 16 + 1]  # positions before the pending tail (8, 9) go to the dump rows [0, 8)
