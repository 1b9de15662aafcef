"""The wheel carries everything the CPU path loads, and the build is free of setuptools packaging/license warnings.

The wheel is built (no dependencies, no build isolation: offline, ~5 s) from a copy of the source tree in
``tmp_path`` -- so the shared checkout gets no ``build/`` or ``*.egg-info`` -- and opened as a zip: the
``sgl_kernel`` CPU stand-in, every shipped server config (found by ``config_path`` through the package, not the
source tree), the SGLang plugin entry point and the ``specopd`` console script must all be in it.
"""

from __future__ import annotations

import configparser
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "server_configs", "sglang_specopd", "kernels", "trainer")
STANDIN = "sglang_specopd/server/cpu/sgl_kernel_standin/sgl_kernel/__init__.py"
# what setuptools says when a directory would be silently dropped or the license metadata is the deprecated kind
WARNING_PATTERNS = (
    r"SetuptoolsDeprecationWarning", r"SetuptoolsWarning", r"is absent from the `packages` configuration",
    r"Installing '.*' as data is deprecated", r"licen[cs]e.*deprecat", r"deprecat.*licen[cs]e",
    r"License classifiers", r"package init file .* not found",
)


def _copy_sources(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    dest.mkdir(parents=True)
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)
    return dest


def _build_wheel(src: Path, out: Path) -> tuple[Path, str]:
    """Build the wheel of ``src`` into ``out``; return it and the build's stdout+stderr (fails the test on error)."""
    if importlib.util.find_spec("build") is not None:
        cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)]
    else:  # pip shows the backend's output only with -v
        cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out),
               str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=src)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    wheels = sorted(out.glob("sglang_specopd-*.whl"))
    assert len(wheels) == 1, (wheels, log[-2000:])
    return wheels[0], log


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("wheel")
    src = _copy_sources(root / "src")
    return _build_wheel(src, root / "dist")


def test_source_configs_reachable_through_the_package() -> None:
    """``sglang_specopd/server_configs`` (what the wheel ships) shows exactly the top-level configs."""
    from sglang_specopd.app.serve.spec import config_path, shipped_config_names, shipped_configs_dir

    top = sorted(p.stem for p in (REPO / "server_configs").glob("*.yaml"))
    assert top and shipped_config_names() == top
    assert shipped_configs_dir() == REPO / "sglang_specopd" / "server_configs"
    for name in top:
        assert config_path(name) == (REPO / "server_configs" / f"{name}.yaml").resolve()
    assert config_path("no-such-config") == Path("no-such-config")


def test_wheel_has_everything_the_cpu_path_loads(built_wheel: tuple[Path, str]) -> None:
    wheel, _ = built_wheel
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert STANDIN in names
        assert zf.read(STANDIN) == (REPO / STANDIN).read_bytes()
        configs = sorted((REPO / "server_configs").glob("*.yaml"))
        assert len(configs) >= 3
        for cfg in configs:
            member = f"sglang_specopd/server_configs/{cfg.name}"
            assert member in names, member
            assert zf.read(member) == cfg.read_bytes()
        # the GPU-verified kernel records decide the CUDA kernels at run time (specopd_kernels.verified)
        records = "specopd_kernels/verified_kernels.json"
        assert zf.read(records) == (REPO / "kernels" / records).read_bytes()
        for pkg in ("sglang_specopd", "sglang_specopd/app", "sglang_specopd/server", "sglang_specopd/wire",
                    "specopd_kernels", "specopd_trainer", "specopd_trainer/loops"):
            assert f"{pkg}/__init__.py" in names, pkg
        assert not any(n.startswith(("tests/", "benchmarks/", "server_configs/", "kernels/", "trainer/"))
                       for n in names), sorted(n for n in names if "/" in n and n.split("/")[0] not in
                                               ("sglang_specopd", "specopd_kernels", "specopd_trainer"))
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = configparser.ConfigParser()
        entry_points.read_string(zf.read(f"{dist_info}/entry_points.txt").decode())
        metadata = zf.read(f"{dist_info}/METADATA").decode()
    assert entry_points["sglang.srt.plugins"]["specopd"] == "sglang_specopd.server.plugin:register"
    assert entry_points["console_scripts"]["specopd"] == "sglang_specopd.app.cli:main"
    assert re.search(r"^License-Expression: Apache-2.0$", metadata, re.M), metadata[:800]
    assert not re.search(r"^Classifier: License ::", metadata, re.M)


def test_build_prints_no_packaging_or_license_warning(built_wheel: tuple[Path, str]) -> None:
    _, log = built_wheel
    assert "Successfully built" in log or "Created wheel" in log, log[-2000:]
    hits = [line for line in log.splitlines()
            if any(re.search(p, line, re.I) for p in WARNING_PATTERNS)]
    assert not hits, "\n".join(hits)
