"""CPU-only adaptations of SGLang 0.5.23 (the one place they live).

Everything here is inert unless SGLang runs its CPU engine (``SGLANG_USE_CPU_ENGINE=1``, which ``specopd serve``
sets for ``--device cpu``); each hook also re-checks the device when it runs. On GPU none of it is registered.
See :mod:`sglang_specopd.server.cpu.patches` for the list and ``tests/test_cpu_patches.py`` for one test per adaptation.
"""

import os
from pathlib import Path

STANDIN_DIR = Path(__file__).with_name("sgl_kernel_standin")


def cpu_engine_enabled() -> bool:
    """True when this process runs SGLang's CPU engine (env ``SGLANG_USE_CPU_ENGINE`` set to a true value)."""
    return os.environ.get("SGLANG_USE_CPU_ENGINE", "").strip().lower() in ("1", "true", "yes", "on")
