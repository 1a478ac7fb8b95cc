"""`launch.local` simulates a multi-host job on one machine: 2 processes × 4 CPU devices train exactly like
1 process × 8 devices (same global batch), and a process that dies takes the job down with it."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from launch import local

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 3


def _main_args(workdir, steps=STEPS):
  # A tiny text-only IL run; global batch 8 splits over 8 devices whichever way they are spread over processes.
  return [f"--config={ROOT}/configs/il.py:smoke", f"--workdir={workdir}", "--config.model.kind=decoder",
          "--config.train.batch_size=8", f"--config.train.steps={steps}", "--config.checkpoint.every=1000",
          "--config.data.num_threads=1"]


def _launcher(num_processes, devices_per_process, workdir, steps=STEPS):
  cmd = [sys.executable, "-m", "launch.local", f"--num_processes={num_processes}",
         f"--devices_per_process={devices_per_process}", "--", *_main_args(workdir, steps)]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines = []
  threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
  return proc, lines


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [(row["step"], row["loss"], row["loss_tokens"]) for row in map(json.loads, f)]


def _child_pids(lines, n, timeout=60):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    pids = [int(l.split(" pid ")[1].split()[0]) for l in list(lines) if l.startswith("[launch] process ")
            and " pid " in l]
    if len(pids) == n:
      return pids
    time.sleep(0.1)
  raise AssertionError("launcher did not report its processes:\n" + "".join(lines))


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
  one, two = tmp_path / "one", tmp_path / "two"
  runs = [_launcher(1, 8, one), _launcher(2, 4, two)]  # concurrently: two cores, mostly compile time
  for proc, lines in runs:
    assert proc.wait(timeout=300) == 0, "".join(lines)
  _, lines = runs[1]
  assert any(l.startswith("[p0] ") for l in lines) and any(l.startswith("[p1] ") for l in lines)
  ref, got = _losses(one), _losses(two)
  assert [s for s, _, _ in got] == list(range(1, STEPS + 1))
  assert [t for _, _, t in got] == [t for _, _, t in ref]  # same global batch (tokens counted over both hosts)
  assert [l for _, l, _ in got] == pytest.approx([l for _, l, _ in ref], abs=1e-5)
  assert ref[0][1] != ref[-1][1]  # it trained
  assert (two / "checkpoints" / str(STEPS)).is_dir()


@pytest.mark.slow
def test_one_process_dying_stops_the_other(tmp_path):
  workdir = tmp_path / "w"
  proc, lines = _launcher(2, 4, workdir, steps=10_000)
  pids = _child_pids(lines, 2)
  deadline = time.monotonic() + 120
  while not (workdir / "metrics.jsonl").exists():  # both are in the training loop, in collectives together
    assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
    time.sleep(0.2)
  os.kill(pids[1], signal.SIGKILL)
  assert proc.wait(timeout=30) == 128 + signal.SIGKILL, "".join(lines)
  assert not _alive(pids[0])
  assert any("process 1 exited with -9: stopping the others" in l for l in lines)


def test_interrupt_stops_all_processes(tmp_path):
  proc, lines = _launcher(2, 4, tmp_path / "w", steps=10_000)
  pids = _child_pids(lines, 2)
  proc.send_signal(signal.SIGINT)
  assert proc.wait(timeout=30) == 130, "".join(lines)
  assert not any(_alive(p) for p in pids)


def test_process_env_sets_devices_and_place_in_job():
  env = local.process_env({"XLA_FLAGS": "--xla_cpu_foo=1 --xla_force_host_platform_device_count=8"},
                          process_id=1, num_processes=2, devices_per_process=4, coordinator="127.0.0.1:1234")
  assert env["XLA_FLAGS"] == "--xla_cpu_foo=1 --xla_force_host_platform_device_count=4"
  assert (env["JAX_PROCESS_ID"], env["JAX_NUM_PROCESSES"], env["JAX_COORDINATOR_ADDRESS"]) == (
      "1", "2", "127.0.0.1:1234")


def test_missing_main_flags_is_a_usage_error():
  with pytest.raises(SystemExit):
    local.main(["--num_processes=2"])
  with pytest.raises(ValueError, match="--num_processes=0"):
    local.launch(["--workdir=x"], num_processes=0, devices_per_process=1)
