"""The shared SPECOPD server on the tiny QSA-GDN target (:func:`qsa_specopd_server`), used by test_serve_qsa.py and
test_train_qsa.py, and the server arguments every QSA test server needs."""

from __future__ import annotations

from pathlib import Path

import pytest

# SGLang sizes the mamba state pool from free memory; a test needs a handful. The radix cache must be off for QSA
# targets on CPU (the QSA pool needs page size 64, the mamba radix cache page size 1; docs/qsa_serving_plan.md).
EXTRA_ARGS = ["--max-mamba-cache-size", "32", "--disable-radix-cache"]
QSA_BLOCK_SIZE = 4  # SPECOPD's block: SGLang's QSA verify takes at most compress_ratio (4) rows per request
QSA_ADMIN_KEY = "qsa-admin-key"


@pytest.fixture(scope="module")
def qsa_specopd_server(request, shared_servers_guard, qsa_target: Path, tmp_path_factory: pytest.TempPathFactory):
    """A SPECOPD server on the same target with a random block-4, 1-layer DFlash drafter (block <= the QSA compress
    ratio, as SGLang's QSA verify requires; its features come from :mod:`sglang_specopd.server.qwen4_exp_features`)
    and :data:`QSA_ADMIN_KEY`: one server shared by test_serve_qsa.py and test_train_qsa.py (tests/_servers.py);
    ``extra["drafter"]``: the start-up drafter's directory."""
    from _servers import lend, start_specopd
    from sglang_specopd.app.launch.process import LaunchSpec, free_port
    from sglang_specopd.wire.drafters.init import init_drafter

    def start(stack):
        drafter = tmp_path_factory.mktemp("qsa-drafter") / "drafter"
        init_drafter(qsa_target, drafter, block_size=QSA_BLOCK_SIZE, num_layers=1, seed=0)
        spec = LaunchSpec(model_path=str(qsa_target), port=free_port(), device="cpu", dtype="float32",
                          attention_backend="torch_native", max_total_tokens=2048, disable_cuda_graph=True,
                          disable_overlap_schedule=True, sleep_on_idle=True, drafter_path=str(drafter),
                          speculative_algorithm="SPECOPD", block_size=QSA_BLOCK_SIZE, admin_api_key=QSA_ADMIN_KEY,
                          extra_args=list(EXTRA_ARGS))
        srv = start_specopd(stack, spec, tmp_path_factory.mktemp("logs"), "qsa-specopd")
        srv.extra["drafter"] = drafter
        return srv

    yield from lend(request, "qsa_specopd_server", start)
