#!/usr/bin/env bash
# The main job on the embedded default (~20 min on 2 CPU cores): install, prepare SmolLM2, start a local SGLang
# server with the SPECOPD drafter, train the drafter against it (a short SFT if none is cached, then SpecOPD),
# redeploy it hot, print the mean acceptance length per domain before and after, stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/specopd main "$@"
