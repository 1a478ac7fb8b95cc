#!/usr/bin/env bash
# The test suite: browser tests included, on CPU, one pytest-xdist worker per core (each module on one worker,
# so a module's fixtures are built once), printing the 30 slowest tests so that every run says where the time
# goes (docs/results/README.md#test-suite). Arguments go to pytest: `-n 0` runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pytest -q -n auto --dist loadscope --durations=30 "$@"
