"""A run killed with SIGKILL and restarted continues from its last checkpoint, with the same losses for the
following steps as an uninterrupted run (model, optimizer, RNG and data position all restored); one sent SIGTERM
saves the step in flight first."""

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


def _cmd(workdir, steps=STEPS, every=EVERY):
  return [sys.executable, "-m", "jaxagent.main", f"--config={ROOT}/configs/il.py:smoke", f"--workdir={workdir}",
          "--config.model.kind=decoder", f"--config.train.steps={steps}", f"--config.checkpoint.every={every}",
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


@pytest.mark.slow
def test_sigterm_saves_the_step_in_flight_and_the_restart_resumes_there(tmp_path):
  """A scheduler's SIGTERM mid-run: the loop checkpoints the step it is on (no periodic checkpoint is due: every
  1,000 steps), the process dies of the signal as before, and the restart resumes from that step."""
  env, run, steps = _env(tmp_path / "jax_cache"), tmp_path / "run", 400
  proc = subprocess.Popen(_cmd(run, steps, every=1000), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  deadline = time.time() + 600
  logged = lambda: (run / "metrics.jsonl").exists() and '"loss"' in (run / "metrics.jsonl").read_text()
  while not logged() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.01)  # the first step's loss is logged: training is under way
  os.kill(proc.pid, signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == -signal.SIGTERM, err.decode()[-3000:]
  saved = sorted(int(p) for p in os.listdir(run / "checkpoints") if p.isdigit())
  assert len(saved) == 1 and 1 <= saved[0] < steps, f"expected the step in flight alone: {saved}"
  assert f"SIGTERM at step {saved[0]}" in err.decode()

  # The restart asks for two steps past the saved one (train.steps may change on a resume), not the rest of the 400.
  end = saved[0] + 2
  resumed = subprocess.run(_cmd(run, end, every=1000), env=env, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  logged_steps = [r["step"] for r in read_jsonl(os.path.join(run, "metrics.jsonl"))]
  assert logged_steps.count(1) == 1 and saved[0] + 1 in logged_steps  # it went on from the saved step
  assert (run / "checkpoints" / str(end)).exists()
