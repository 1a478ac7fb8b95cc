"""What a result was measured with: the commit of the source tree, the package versions and the machine.

    provenance()           {"commit", "dirty", "packages", "python", "machine"}
    with_provenance(r)     {**r, "provenance": provenance()}: what a `results.json` writer saves

Every stage's `run_config.json` carries it under "provenance" (`pipeline/stages.py`), and `main` writes it to
`<workdir>/provenance.json` beside the config. The commit is that of the git checkout holding this package
(None when it is not in one, e.g. a wheel installed into site-packages); `dirty` says whether tracked files
differ from it. Nothing here raises: a part that cannot be read is None. The git and package parts are read
once per process; the JAX devices at each call (`jax.distributed` may start after the first one).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from typing import Any

# Distributions whose versions change results, as pip names them; only the installed ones are listed.
PACKAGES = ("jaxagent", "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "libtpu", "flax", "optax",
            "orbax-checkpoint", "grain", "numpy", "ml-collections", "transformers", "tokenizers", "safetensors",
            "playwright", "miniwob", "pillow", "openai", "gguf", "selectolax", "torch", "ray")
GIT_TIMEOUT_S = 10.0
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../jaxagent


def _git(root: str, *args: str) -> str | None:
  """`git -C root args...`'s stdout, stripped; None when git is missing, fails or takes too long."""
  try:
    done = subprocess.run(["git", "--no-optional-locks", "-C", root, *args], capture_output=True, text=True,
                          timeout=GIT_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
  except (OSError, subprocess.SubprocessError):
    return None
  return done.stdout.strip() if done.returncode == 0 else None


def git_state(root: str | None = None) -> dict[str, Any]:
  """`{"commit": HEAD's sha or None, "dirty": bool or None}` of the checkout holding `root` (default: this
  package's directory). `dirty` is about tracked files only (`git status --untracked-files=no`), read without
  taking the index lock, so it changes nothing in the checkout."""
  return dict(_git_state(os.path.abspath(root or _PACKAGE_DIR)))


@functools.cache
def _git_state(root: str) -> tuple[tuple[str, Any], ...]:
  commit = _git(root, "rev-parse", "HEAD") if os.path.isdir(root) else None
  if not commit:
    return (("commit", None), ("dirty", None))
  status = _git(root, "status", "--porcelain", "--untracked-files=no")
  return (("commit", commit), ("dirty", None if status is None else bool(status)))


@functools.cache
def _packages() -> tuple[tuple[str, str], ...]:
  out = []
  for name in PACKAGES:
    try:
      out.append((name, importlib.metadata.version(name)))
    except Exception:  # pylint: disable=broad-except  # not installed, or broken metadata: left out
      continue
  return tuple(out)


def packages() -> dict[str, str]:
  """`{distribution: version}` of the installed ones among `PACKAGES` (importlib.metadata)."""
  return dict(_packages())


def _memory_gib() -> float | None:
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return round(int(line.split()[1]) * 1024 / 2**30, 1)
  except (OSError, ValueError, IndexError):
    pass
  try:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
  except (AttributeError, OSError, ValueError):
    return None


@functools.cache
def _host() -> tuple[tuple[str, Any], ...]:
  try:
    hostname = socket.gethostname()
  except OSError:
    hostname = None
  return (("hostname", hostname), ("platform", platform.platform()), ("cpu_count", os.cpu_count()),
          ("memory_gib", _memory_gib()))


def _accelerators() -> dict[str, Any]:
  """JAX's view: the device kinds (each once, in device order), counts, backend and process count."""
  try:
    import jax  # pylint: disable=g-import-not-at-top
    devices = jax.devices()
    kinds = list(dict.fromkeys(str(d.device_kind) for d in devices))
    return {"devices": kinds, "device_count": len(devices), "local_device_count": jax.local_device_count(),
            "backend": jax.default_backend(), "process_count": jax.process_count()}
  except Exception:  # pylint: disable=broad-except  # no JAX, or no backend: the rest is still worth saving
    return {"devices": None, "device_count": None, "local_device_count": None, "backend": None,
            "process_count": None}


def provenance(root: str | None = None) -> dict[str, Any]:
  """The commit (of the checkout holding `root`, default this package), whether tracked files differ from it,
  the installed packages' versions, Python's version and the machine. A fresh dict each call."""
  return {**git_state(root), "packages": packages(), "python": platform.python_version(),
          "executable": sys.executable, "machine": {**dict(_host()), **_accelerators()}}


def with_provenance(results: dict[str, Any]) -> dict[str, Any]:
  """`results` with a "provenance" key: what a `results.json` writer saves."""
  return {**results, "provenance": provenance()}
