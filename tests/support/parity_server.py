"""The shared parity server (:func:`parity_server`): SPECOPD on the tiny target with a drafter whose weights are 10x
the init scale (:func:`strong_drafter`, block :data:`BLOCK_SIZE`, no admin key), used by test_trainer_parity.py and
test_draft_opd_parity.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


BLOCK_SIZE = 8


def strong_drafter(target: Path, out: Path):
    from sglang_specopd.wire.drafters.init import init_drafter, init_drafter_tensors, save_drafter

    spec = init_drafter(target, out, block_size=BLOCK_SIZE, num_layers=2, seed=1, target_layer_ids=[0, 2])
    g = torch.Generator().manual_seed(5)
    tensors = {n: (t * 10 if t.ndim == 2 else 1 + 0.3 * torch.randn(t.shape, generator=g))
               for n, t in init_drafter_tensors(spec, seed=3).items()}
    save_drafter(spec, tensors, out, overwrite=True)
    return spec


@pytest.fixture(scope="module")
def parity_server(request, shared_servers_guard, tiny_target: Path, tmp_path_factory: pytest.TempPathFactory):
    """The SPECOPD server (tiny target, :func:`strong_drafter`, block 8, no admin key) of test_trainer_parity.py
    and test_draft_opd_parity.py: one shared server (tests/_servers.py); its drafter directory is
    ``spec.drafter_path``."""
    from _servers import lend, start_specopd
    from conftest import tiny_launch_spec
    from sglang_specopd.app.launch.process import free_port

    def start(stack):
        root = tmp_path_factory.mktemp("parity")
        strong_drafter(tiny_target, root / "drafter")
        spec = tiny_launch_spec(tiny_target, free_port(), root / "drafter")
        spec.block_size = BLOCK_SIZE
        return start_specopd(stack, spec, root, "parity")

    yield from lend(request, "parity_server", start)
