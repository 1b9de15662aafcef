"""torchrun worker for tests/test_trainer_fsdp.py (2 CPU processes, gloo): SpecOPD under FSDP2 against the
stand-in scorer of tests/fakes/scorers.py (rows depend only on the request, so a resumed run sees the rows an
uninterrupted one saw). ``OUT/straight``: 6 steps, pushing every 2 (the pushed tensors saved by rank 0 as
``push<step>.pt``); ``OUT/crash``: dies after step 5 (checkpoint at step 4), resumed with another drafter init. Final
weights per rank in ``<run>/rank<r>.pt``."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _fsdp_sft_worker import Crash, crash_at  # noqa: E402
from _sft_fixture import tiny_drafter, tiny_sequences  # noqa: E402
from fakes.scorers import HashScorer as _HashScorer  # noqa: E402

from specopd_trainer.algorithms.specopd.config import SpecOPDConfig  # noqa: E402
from specopd_trainer.algorithms.specopd.loop import train_specopd  # noqa: E402
from specopd_trainer.loops import engine  # noqa: E402

CFG = SpecOPDConfig(compute_dtype="float32", seqs_per_step=3, anchors_per_seq=2, root_anchors_per_seq=2, branches=3,
                    loss="e2e_fkl_is", steps=6, ckpt_every=2, warmup_steps=0, min_lr_ratio=1.0, lr=1e-2,
                    push_every=2, log_every=1, parallel="fsdp2")


def main(out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    out = Path(out)
    seqs = tiny_sequences(4)

    def push(step, drafter):
        torch.save(drafter.checkpoint_tensors(), out / "straight" / f"push{step}.pt")

    def train(run: str, seed: int = 0, **kw):
        drafter = tiny_drafter(seed=seed)
        summary = train_specopd(drafter, _HashScorer(), seqs, out / run, CFG, progress=False, **kw)
        torch.save(drafter.state_dict(), out / run / f"rank{dist.get_rank()}.pt")
        return summary

    summary = train("straight", push=push)
    assert summary["pushed"] == ([2, 4, 6] if dist.get_rank() == 0 else []), summary["pushed"]
    plain = engine.TrainProgress
    engine.TrainProgress = crash_at(5)
    try:
        train("crash")
        raise AssertionError("the run did not crash")
    except Crash:
        pass
    engine.TrainProgress = plain
    summary = train("crash", seed=99)
    assert summary["start_step"] == 4, summary["start_step"]
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
