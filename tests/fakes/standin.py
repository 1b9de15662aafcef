"""The CPU adaptations' ``sgl_kernel`` stand-in package, loaded from its file under a private name (no ``sgl_kernel``
in sys.modules): what the CPU-op tests call."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


STANDIN_INIT = REPO / "sglang_specopd" / "server" / "cpu" / "sgl_kernel_standin" / "sgl_kernel" / "__init__.py"


def load_standin():
    """Import the stand-in package (``__init__`` and its submodules) as ``_specopd_sgl_kernel_standin_under_test``."""
    name = "_specopd_sgl_kernel_standin_under_test"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, STANDIN_INIT,
                                                  submodule_search_locations=[str(STANDIN_INIT.parent)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # the package's relative imports (``from . import mamba``) look it up there
    spec.loader.exec_module(mod)
    return mod
