#!/usr/bin/env bash
# The test suite: browser tests included, on CPU, well under 20 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pytest -q "$@"
