"""Draft-OPD under ``torchrun`` (``parallel: ddp`` or ``fsdp2``): the pieces the loop needs beyond one process.

Every rank draws the step's ``rollout_prompts`` prompts from the rank-0 step generator (the single-process draw) and
rolls out its share (prompts ``rank, rank + world, ...``) through the shared server, selects the blocks of its own
rollouts and replays them in ONE forward of :class:`ReplayStep` (the unit DDP wraps or FSDP2 shards). A step needs
blocks on some rank (:func:`all_sum`; else another round of rollouts on every rank); a rank without blocks runs
a zero loss. Each rank's loss is weighed by its share of the step's blocks (the gradients are averaged over
ranks, so the step's loss is the block-weighted mean of the ranks' losses). Rank 0 pushes (the full drafter, gathered under FSDP2) and :func:`broadcast_version`
tells every rank which version it pushed before any rank rolls out, so every rank's ledger judges staleness alike.
A rank that finds nothing to replay stops every rank (:func:`agree_or_raise`), never leaving the others waiting in
a collective. Recorded traffic (``from_traffic``) is one cursor: it runs in a single process only.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch


class ReplayStep(torch.nn.Module):
    """The DDP-wrappable / FSDP2-shardable unit: one step's replay loss on the selected blocks
    (:func:`.replay.draft_opd_step`, or :func:`.replay.sft_step` without replay)."""

    def __init__(self, drafter, client, cfg, layer_ids: List[int]):
        super().__init__()
        self.drafter = drafter
        self._client, self._cfg, self._layer_ids = client, cfg, layer_ids

    def forward(self, selected):
        """(loss: fp32 scalar with graph, metrics dict) of the selected ``[(rollout, records)]`` blocks; for no
        blocks a zero loss (with a graph: every rank runs backward) and zero counts under the same metric keys."""
        from specopd_trainer.algorithms.draft_opd.replay import draft_opd_step, sft_step

        cfg = self._cfg
        if not selected:
            zero = sum(p.sum() for p in self.drafter.parameters() if p.requires_grad) * 0.0
            keys = (("blocks", "accepted_tokens", "rejected_tokens", "step_supervised_tokens", "step_scored_tokens")
                    if cfg.replay else ("blocks", "step_supervised_tokens"))
            m = {**{k: 0 for k in keys}, "score_s": 0.0, "loss_s": 0.0}
            return zero, ({**m, "est_tau": None} if cfg.replay else m)
        if cfg.replay:
            return draft_opd_step(self.drafter, self._client, selected, self._layer_ids, loss=cfg.loss,
                                  gamma=cfg.gamma, lambda_acc=cfg.lambda_acc, lambda_rej=cfg.lambda_rej,
                                  head_dtype=cfg.head_dtype, rejected_slots=cfg.rejected_slots)
        return sft_step(self.drafter, self._client, selected, self._layer_ids, gamma_decay=cfg.sft_gamma_decay)


def all_sum(n: int) -> int:
    """``n`` summed over ranks. COLLECTIVE."""
    import torch.distributed as dist

    t = torch.tensor([n], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())


def broadcast_version(version: Any) -> Any:
    """Rank 0's ``version`` (the one it just pushed) on every rank. COLLECTIVE."""
    import torch.distributed as dist

    box = [version]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def agree_or_raise(error: Optional[Exception]) -> None:
    """Every rank passes its own failure of the step's gathering (None: it found blocks); if any rank failed, every
    rank raises ValueError (its own message, or one naming the failed ranks). COLLECTIVE."""
    import torch.distributed as dist

    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, None if error is None else str(error))
    failed = [(r, m) for r, m in enumerate(flags) if m is not None]
    if failed:
        if error is not None:
            raise error
        raise ValueError(f"rank {failed[0][0]} stopped: {failed[0][1]}")


def reduce_metrics(m: Dict[str, Any], world: int) -> Dict[str, Any]:
    """A step's metrics over all ranks (every rank passes the same keys): ints and lists of ints summed (counts),
    floats and lists of floats averaged over the ranks that have a value (None: no value), anything else rank 0's.
    COLLECTIVE."""
    import torch.distributed as dist

    keys = sorted(k for k, v in m.items() if v is None or isinstance(v, (int, float, list)))
    flat: List[float] = []
    for k in keys:
        v = m[k]
        vals = v if isinstance(v, list) else [v]
        for x in vals:
            flat += [0.0 if x is None else float(x), 0.0 if x is None else 1.0]
    t = torch.tensor(flat, dtype=torch.float64)
    dist.all_reduce(t)
    total = t.tolist()
    out, i = dict(m), 0
    for k in keys:
        v = m[k]
        vals = v if isinstance(v, list) else [v]
        red = []
        for x in vals:
            s, n = total[i], total[i + 1]
            i += 2
            if isinstance(x, bool) or not isinstance(x, (int, float)) and x is not None:
                red.append(x)
            elif isinstance(x, int):
                red.append(int(round(s)))
            else:
                red.append(s / n if n else None)
        out[k] = red if isinstance(v, list) else red[0]
    return out
