"""The layer rules of ``.importlinter`` hold (app -> trainer | plugin -> wire -> kernels, no cycles, no SGLang
below the plugin, ``cpu/`` only from the plugin's entry point), checked with import-linter's ``lint-imports``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(exe), "--config", str(REPO / ".importlinter")], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    # every contract was checked and kept (a contract file that parses to nothing would also exit 0)
    n_contracts = (REPO / ".importlinter").read_text().count("[importlinter:contract:")
    assert n_contracts >= 4 and f"Contracts: {n_contracts} kept, 0 broken." in res.stdout, res.stdout[-2000:]


def test_trainer_does_not_load_sglang_or_the_plugin() -> None:
    # importing the whole trainer and the wire protocol must not import SGLang or the plugin (a runtime check of
    # what the static contracts say, which would miss imports done through importlib)
    code = ("import sys, specopd_trainer, specopd_trainer.collect, specopd_trainer.features, specopd_trainer.client.http,"
            " specopd_trainer.pipeline, sglang_specopd.wire.protocol, sglang_specopd.wire.drafters.format;"
            " bad = [m for m in sys.modules if m == 'sglang' or m.startswith(('sglang.', 'sglang_specopd.server',"
            " 'sglang_specopd.app'))]; print(bad); assert not bad")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
