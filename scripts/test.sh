#!/usr/bin/env bash
# Run the test suite (installs first if needed). Extra arguments go to pytest.
#   bash scripts/test.sh            the whole suite (what CI runs), real SGLang servers included
#   bash scripts/test.sh --quick    the inner loop (<= 5 min): -m "not server and not slow"; a test that starts an
#                                   SGLang server without the server marker fails there (docs/testing.md)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=()
if [ "${1:-}" = "--quick" ]; then
  shift
  quick=(-m "not server and not slow")
  export SPECOPD_TEST_NO_SERVERS=1
fi
bash scripts/setup.sh
export SPECOPD_REQUIRE_SMOLLM2=1
# Two pytest-xdist workers by default on a machine with >= 2 cores (SPECOPD_TEST_WORKERS=N to change, 0 for one
# process; docs/testing.md): most of the suite keeps one core busy (a server with one OpenMP thread, single-threaded
# tests), so two workers use both; each shared server stays on one worker (--dist loadgroup, tests/_servers.py
# xdist_groups). Measured times: docs/testing.md.
cores=$(nproc 2>/dev/null || echo 1)
workers=${SPECOPD_TEST_WORKERS:-$(( cores >= 2 ? 2 : 0 ))}
xdist=()
if [ "$workers" != "0" ]; then
  xdist=(-n "$workers" --dist loadgroup --no-loadscope-reorder)  # groups in collection order: servers first
fi
# Every run in a random order (pytest-randomly: modules shuffled, tests shuffled within each module; the modules
# that share a server still run one after another, tests/_servers.py). The seed is printed first and last; replay
# an order with SPECOPD_TEST_SEED=N, or run in file order with `-p no:randomly` (docs/testing.md).
order=()
case " $* " in
  *" no:randomly "*|*"-p no:randomly"*) echo "[test] file order (-p no:randomly)" >&2 ;;
  *) seed=${SPECOPD_TEST_SEED:-$(( (RANDOM << 15 | RANDOM) ))}
     echo "[test] random order, seed $seed (replay: SPECOPD_TEST_SEED=$seed bash scripts/test.sh ...)" >&2
     order=(-p randomly "--randomly-seed=$seed") ;;
esac
exec .venv/bin/python -m pytest -q --durations=30 ${xdist[@]+"${xdist[@]}"} ${order[@]+"${order[@]}"} ${quick[@]+"${quick[@]}"} "$@"
