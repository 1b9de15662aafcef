#!/usr/bin/env bash
# The main job on the embedded default (<= 20 min on 2 CPU cores): install, prepare SmolLM2, start a local SGLang
# server with the shipped drafter, send old-domain then shifted (new-domain) traffic, adapt the drafter live from
# that traffic (specopd adapt, guarded), print held-out tau before/after on new and old domains, stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/specopd main "$@"
