"""Load a benchmark's script (``benchmarks/<name>/run.py``) as a module, for tests of its functions."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    """``benchmarks/<name>/run.py`` (the experiment's script) as a fresh module, not registered in sys.modules."""
    spec = importlib.util.spec_from_file_location(f"{name}_run", ROOT / "benchmarks" / name / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tiny_specopd_config(path: Path, target: Path, drafter: Path, name: str) -> Path:
    """Write a server config YAML for a tiny fp32 SPECOPD server on CPU (block 4, torch_native attention, the
    tiny fixtures of conftest.py) at ``path``, for benchmark scripts that take ``--config``; returns ``path``."""
    import yaml

    path.write_text(yaml.safe_dump({
        "name": name, "target": str(target), "drafter": str(drafter), "speculative_algorithm": "SPECOPD",
        "block_size": 4, "device": "cpu", "dtype": "float32", "attention_backend": "torch_native",
        "max_total_tokens": 4096, "disable_cuda_graph": True, "disable_overlap_schedule": True,
        "sleep_on_idle": True}))
    return path
