"""One rank of the 2-rank gloo test of the vocab-sharded score_trees head (tests/test_score_head.py).

A module of its own so spawned ranks import only torch and :mod:`sglang_specopd.server.scoring.head` (not SGLang).
"""

from __future__ import annotations

import torch


def pad_rows(head: torch.Tensor, multiple: int) -> torch.Tensor:
    """The head padded with garbage rows to a multiple of ``multiple`` rows (SGLang pads its vocab-parallel head;
    padding rows must never be scored)."""
    pad = (-head.shape[0]) % multiple
    return torch.cat([head, torch.full((pad, head.shape[1]), 50.0)]) if pad else head


def tp_rank(rank: int, world: int, init: str, h: torch.Tensor, head: torch.Tensor, top_k: int, queue) -> None:
    """Rank ``rank``: its own vocab shard of the padded head, rows as SGLang's VocabParallelEmbedding splits them
    (rank r: padded rows r*Vl .. (r+1)*Vl, real ids up to the unpadded vocabulary); puts ``(rank, outputs)``."""
    import torch.distributed as dist

    from sglang_specopd.server.scoring.head import VocabShard, shard_head_outputs

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        vocab = head.shape[0]
        padded = pad_rows(head, world * 4)
        per = padded.shape[0] // world
        start = rank * per
        shard = VocabShard(start, max(0, min(per, vocab - start)), vocab, world)

        def gather(t: torch.Tensor) -> torch.Tensor:
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.contiguous())
            return torch.cat(parts, dim=-1)

        out = shard_head_outputs(h, padded[start: start + per], ["topk", "logprobs"], top_k, torch.float32, shard,
                                 gather)
        # numpy arrays travel by value (torch tensors would go through shared memory that dies with this process)
        queue.put((rank, {k: v.numpy() for k, v in out.items()}))
        dist.barrier()  # a rank that closed its sockets early would reset its peer's last all-gather
    finally:
        dist.destroy_process_group()
