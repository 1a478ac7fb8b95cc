#!/usr/bin/env bash
# The test suite: browser tests included, on CPU (33 min on 2 cores when last timed: docs/results/README.md),
# printing the 30 slowest tests so that every run says where the time goes.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pytest -q --durations=30 "$@"
