#!/usr/bin/env bash
# The main job on the embedded default: install, prepare SmolLM2, serve it with the SPECOPD drafter,
# send a chat completion, print the reply and acceptance statistics, stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/specopd demo "$@"
