#!/usr/bin/env bash
# The test suite: browser tests included, on CPU (27 min on 2 cores when last timed: docs/results/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pytest -q "$@"
