"""torchrun worker for tests/test_trainer_fsdp.py (2 CPU processes, gloo, FSDP2): SFT runs the test compares with
single-process runs. ``OUT/fsdp``: 20 straight steps (held-out greedy-walk tau every 10 on 2 sequences); ``OUT/crash``: a run that dies after step 12 (checkpoint at
step 10), copied to ``OUT/crash_copy`` (for a single-process resume), then resumed here under FSDP2 with a
differently initialised drafter; ``OUT/from_single``: a single-process checkpoint the test wrote, resumed under
FSDP2. Each run's final drafter weights go to ``<run>/rank<r>.pt`` (every rank, after the engine materialised them).
"""

import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _sft_fixture import tiny_drafter, tiny_sequences  # noqa: E402

from specopd_trainer.algorithms.sft.config import SFTConfig  # noqa: E402
from specopd_trainer.algorithms.sft.loop import train_sft  # noqa: E402
from specopd_trainer.loops import engine  # noqa: E402


class Crash(RuntimeError):
    pass


def cfg(**kw) -> SFTConfig:
    """The runs' config (the test builds the single-process runs with the same)."""
    base = dict(steps=20, seqs_per_step=3, anchors_per_seq=4, log_every=1, ckpt_every=5, warmup_steps=2, lr=3e-3,
                eval_every=10, parallel="fsdp2")
    base.update(kw)
    return SFTConfig(**base)


def crash_at(step_to_crash: int):
    """A TrainProgress whose update raises Crash after ``step_to_crash`` (after its metrics row; both ranks)."""

    class CrashAt(engine.TrainProgress):
        def update(self, step, wall, postfix):
            if step == step_to_crash:
                raise Crash(step)
            super().update(step, wall, postfix)

    return CrashAt


def main(out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    out = Path(out)
    seqs = tiny_sequences()

    def train(run: str, seed: int = 0):
        drafter = tiny_drafter(seed=seed)
        train_sft(drafter, seqs, seqs[:2] if run == "fsdp" else [], out / run, cfg(), progress=False)
        torch.save(drafter.state_dict(), out / run / f"rank{dist.get_rank()}.pt")

    train("fsdp")
    plain = engine.TrainProgress
    engine.TrainProgress = crash_at(12)
    try:
        train_sft(tiny_drafter(), seqs, [], out / "crash", cfg(), progress=False)
        raise AssertionError("the run did not crash")
    except Crash:
        pass
    engine.TrainProgress = plain
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.copytree(out / "crash", out / "crash_copy")
    dist.barrier()
    train("crash", seed=99)  # everything must come from the checkpoint
    if (out / "from_single").is_dir():
        train("from_single", seed=99)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
