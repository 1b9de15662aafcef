"""The shared SPECOPD server on the tiny hybrid Gated DeltaNet target (:func:`hybrid_specopd_server`), used by
test_serve_hybrid_gdn.py, test_score_trees_hybrid_gdn.py and test_train_hybrid_gdn.py, and its launch spec."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest


BLOCK_SIZE = 4


# SGLang sizes the mamba state pool from free memory (47016 slots, 4.7 GB here); a test needs a handful.
MAMBA_CACHE_ARGS = ["--max-mamba-cache-size", "32"]


HYBRID_ADMIN_KEY = "hybrid-admin"


def hybrid_launch_spec(target: Path, port: int, drafter: Path | None = None):
    from sglang_specopd.app.launch.process import LaunchSpec

    return LaunchSpec(
        model_path=str(target), port=port, device="cpu", dtype="float32", attention_backend="torch_native",
        max_total_tokens=2048, disable_cuda_graph=True, disable_overlap_schedule=True, sleep_on_idle=True,
        drafter_path=str(drafter) if drafter else None, speculative_algorithm="SPECOPD" if drafter else None,
        block_size=BLOCK_SIZE if drafter else None, extra_args=list(MAMBA_CACHE_ARGS),
    )


@pytest.fixture(scope="module")
def hybrid_specopd_server(request, shared_servers_guard, hybrid_target: Path,
                          tmp_path_factory: pytest.TempPathFactory):
    """The SPECOPD server on the hybrid target (a random block-4, 1-layer drafter; :data:`HYBRID_ADMIN_KEY`; a
    prefix cache and a 32-row piece budget configured, which a hybrid target does not use) of test_serve_hybrid_gdn.py,
    test_score_trees_hybrid_gdn.py and test_train_hybrid_gdn.py: one shared server (tests/_servers.py), serving its
    start-up drafter when a module starts; ``extra["drafter"]``: that drafter's directory."""
    from _servers import lend, start_specopd
    from sglang_specopd.app.launch.process import free_port
    from sglang_specopd.wire.drafters.init import init_drafter

    def start(stack):
        drafter = tmp_path_factory.mktemp("hybrid-drafter") / "drafter"
        init_drafter(hybrid_target, drafter, block_size=BLOCK_SIZE, num_layers=1, seed=0)
        spec = dataclasses.replace(hybrid_launch_spec(hybrid_target, free_port(), drafter), admin_api_key=HYBRID_ADMIN_KEY,
                                   prefix_cache_mb=16, score_budget_tokens=32)
        srv = start_specopd(stack, spec, tmp_path_factory.mktemp("logs"), "hybrid-specopd")
        srv.extra["drafter"] = drafter
        return srv

    yield from lend(request, "hybrid_specopd_server", start)
