#!/usr/bin/env bash
# The test suite: browser tests included, on CPU, one pytest-xdist worker per core (each module on one worker,
# so a module's fixtures are built once), printing the 30 slowest tests so that every run says where the time
# goes (docs/results/README.md#test-suite). Lanes (pytest's `multiprocess` marker):
#   bash scripts/test.sh                      everything but the multi-process lane (the README's test command)
#   bash scripts/test.sh --lane multiprocess  the 2-process re-runs of whole recipes and the slow-compile barrier
#   bash scripts/test.sh --lane all           both in one run
# Other arguments go to pytest: `-n 0` runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
lane=main
if [[ "${1:-}" == "--lane" ]]; then
  lane="${2:?--lane takes main, multiprocess or all}"
  shift 2
fi
case "$lane" in
  main) select=(-m "not multiprocess") ;;
  multiprocess) select=(-m multiprocess) ;;
  all) select=() ;;
  *) echo "--lane $lane: choose main, multiprocess or all" >&2; exit 2 ;;
esac
exec python -m pytest -q -n auto --dist loadscope --durations=30 ${select[@]+"${select[@]}"} "$@"
