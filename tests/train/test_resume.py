"""A run killed with SIGKILL and restarted continues from its last checkpoint, with the same losses for the
following steps as an uninterrupted run (model, optimizer, RNG and data position all restored)."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxagent.train.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, EVERY = 24, 4


def _cmd(workdir):
  return [sys.executable, "-m", "jaxagent.main", f"--config={ROOT}/configs/il.py:smoke", f"--workdir={workdir}",
          "--config.model.kind=decoder", f"--config.train.steps={STEPS}", f"--config.checkpoint.every={EVERY}",
          "--config.checkpoint.keep=20", "--config.mesh.fsdp=2", "--config.mesh.data=1"]


def _env(cache):
  # Same executables across the three runs, compiled once (the persistent cache changes no numerics).
  return dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
              JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def _losses(workdir):
  return {r["step"]: r["loss"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))}  # last wins


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
  env = _env(tmp_path / "jax_cache")
  ref, run = tmp_path / "ref", tmp_path / "run"
  subprocess.run(_cmd(ref), env=env, check=True, capture_output=True, timeout=600)

  proc = subprocess.Popen(_cmd(run), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  first_ckpt = run / "checkpoints" / str(EVERY)
  deadline = time.time() + 600
  while not first_ckpt.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.01)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL, "the run must be killed, not finish"
  saved = sorted(int(p) for p in os.listdir(run / "checkpoints") if p.isdigit())
  assert saved and saved[-1] < STEPS, f"killed run already had every checkpoint: {saved}"

  resumed = subprocess.run(_cmd(run), env=env, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  ref_losses, run_losses = _losses(ref), _losses(run)
  after = [s for s in range(saved[-1] + 1, STEPS + 1)]
  assert len(after) >= STEPS // 2
  np.testing.assert_allclose([run_losses[s] for s in after], [ref_losses[s] for s in after], rtol=1e-6)
  assert ref_losses[STEPS] < ref_losses[1]
  assert (run / "checkpoints" / str(STEPS)).exists()
