"""torchrun worker for tests/test_trainer_sft.py::test_ddp_two_gloo_ranks (2 CPU processes, gloo)."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _sft_fixture import tiny_drafter, tiny_sequences  # noqa: E402

from specopd_trainer.algorithms.sft.config import SFTConfig  # noqa: E402
from specopd_trainer.algorithms.sft.loop import train_sft  # noqa: E402


def main(out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    drafter = tiny_drafter()
    summary = train_sft(drafter, tiny_sequences(), [], Path(out) / "run",
                        SFTConfig(steps=3, seqs_per_step=2, anchors_per_seq=4, log_every=1, ckpt_every=10,
                                  warmup_steps=1), progress=False)
    rank = dist.get_rank()
    flat = torch.cat([p.detach().flatten() for p in drafter.parameters()])
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"world": dist.get_world_size(), "loss": summary["loss"],
                                                            "checksum": float(flat.double().sum()),
                                                            "first": flat[:8].tolist()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
