"""A recipe run SIGKILLed mid-stage: the end-to-end tests' first half (the second resumes it in-process)."""

import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def committed(path: str) -> int:
  """Complete lines (stored episodes) of a store's `episodes.jsonl`; 0 before it exists."""
  if not os.path.exists(path):
    return 0
  with open(path, "rb") as f:
    return sum(1 for line in f if line.endswith(b"\n"))


def run_until(config: str, workdir: str, marker: str, timeout_s: float = 600.0) -> int:
  """Starts `python -m jaxagent.main --config=<config> --workdir=<workdir>` and SIGKILLs its process group once
  the store file `marker` holds an episode (or the run ends, or `timeout_s` passes); returns the episodes stored."""
  env = {**os.environ, "PYTHONPATH": ROOT, "XLA_FLAGS": ""}
  proc = subprocess.Popen([sys.executable, "-m", "jaxagent.main", f"--config={config}", f"--workdir={workdir}"],
                          cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + timeout_s
  while committed(marker) < 1 and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.2)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  return committed(marker)
