#!/usr/bin/env bash
# Run the test suite (installs first if needed). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPECOPD_REQUIRE_SMOLLM2=1
exec .venv/bin/python -m pytest -q --durations=20 "$@"
