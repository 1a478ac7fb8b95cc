#!/usr/bin/env bash
# The test suite: browser tests included, on CPU, one pytest-xdist worker per core (each module on one worker,
# so a module's fixtures are built once), printing the 30 slowest tests so that every run says where the time
# goes (docs/results/README.md#test-suite). Lanes (pytest's `multiprocess` and `long` markers):
#   bash scripts/test.sh                      the README's test command: unit, browser and parity tests, and one
#                                             end-to-end run per recipe (killed and resumed)
#   bash scripts/test.sh --lane multiprocess  the 2-process re-runs of whole recipes and the slow-compile barrier
#   bash scripts/test.sh --lane long          whole recipes re-run in their other modes, model families and tools,
#                                             and the benchmark's checks over hundreds of intents
#   bash scripts/test.sh --lane multiprocess,long   two lanes in one run (what CI runs after the README's)
#   bash scripts/test.sh --lane all           every test
# Other arguments go to pytest: `-n 0` runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
lane=main
if [[ "${1:-}" == "--lane" ]]; then
  lane="${2:?--lane takes main, multiprocess, long, multiprocess,long or all}"
  shift 2
fi
case "$lane" in
  main) select=(-m "not multiprocess and not long") ;;
  all) select=() ;;
  *)
    IFS=, read -ra names <<< "$lane"
    for name in "${names[@]}"; do
      [[ "$name" == multiprocess || "$name" == long ]] && continue
      echo "--lane $lane: choose main, multiprocess, long (or a comma list of these two) or all" >&2; exit 2
    done
    select=(-m "${lane//,/ or }") ;;
esac
exec python -m pytest -q -n auto --dist loadscope --durations=30 ${select[@]+"${select[@]}"} "$@"
