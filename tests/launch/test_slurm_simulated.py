"""`launch/slurm.sbatch` run for real under a simulated SLURM job on this machine: a fake `srun` on PATH starts
`$SLURM_NTASKS` tasks of one node the way SLURM's does (per-task `SLURM_*` environment, `--label`,
`--kill-on-bad-exit`), and `jax.distributed.initialize()` finds its place from that environment alone (JAX's SLURM
detection: coordinator = the step's first node name, port from the job id or `JAX_COORDINATOR_PORT`).

The job's tasks are CPU "hosts" of 2 devices each (as `launch.local` sets them up); their 2 × 2 run must train
exactly like one process with 4 devices on the same global batch.
"""

import ipaddress
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SBATCH = os.path.join(ROOT, "launch", "slurm.sbatch")
STEPS = 3
NTASKS = 2
DEVICES_PER_TASK = 2

# SLURM's srun for one step on one node, as far as slurm.sbatch relies on it. The job-level variables
# (SLURM_JOB_ID, SLURM_NTASKS, SLURM_JOB_NODELIST, ...) come from the environment, as sbatch sets them; each task
# gets the step's and its own. --label prefixes every line of a task's output with "<task id>: ";
# --kill-on-bad-exit=1 terminates the step's other tasks once one exits non-zero (SIGTERM, then SIGKILL);
# srun's status is then that task's (128 + signal for one killed by a signal, as a shell reports it).
FAKE_SRUN = r'''#!{python}
import os, signal, subprocess, sys, threading, time

args = sys.argv[1:]
label = kill_on_bad_exit = False
while args and args[0].startswith("-"):
  opt = args.pop(0)
  if opt == "--label" or opt == "-l":
    label = True
  elif opt.startswith("--kill-on-bad-exit"):
    kill_on_bad_exit = opt.partition("=")[2] in ("", "1")
  elif opt == "-K":
    kill_on_bad_exit = True
  elif "=" not in opt and opt.startswith("--"):
    sys.exit(f"fake srun: option {{opt}} not simulated")
if not args:
  sys.exit("fake srun: no command")
ntasks = int(os.environ.get("SLURM_NTASKS", "1"))
node = os.environ["SLURM_JOB_NODELIST"]
step = {{"SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NODELIST": node, "SLURM_NODELIST": node,
        "SLURM_STEP_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks), "SLURM_STEP_TASKS_PER_NODE": str(ntasks),
        "SLURM_TASKS_PER_NODE": str(ntasks), "SLURM_NODEID": "0", "SLURMD_NODENAME": node,
        "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_SRUN_COMM_HOST": "127.0.0.1"}}
procs = []
for task in range(ntasks):
  env = {{**os.environ, **step, "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task), "SLURM_TASK_PID": ""}}
  procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True))

lock = threading.Lock()
def pump(task, stream):
  prefix = f"{{task}}: ".encode() if label else b""
  for line in iter(stream.readline, b""):
    with lock:
      sys.stdout.buffer.write(prefix + line)
      sys.stdout.buffer.flush()
pumps = [threading.Thread(target=pump, args=(i, p.stdout), daemon=True) for i, p in enumerate(procs)]
for t in pumps:
  t.start()

def terminate():
  for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
    for p in procs:
      if p.poll() is None:
        try:
          os.killpg(p.pid, sig)
        except ProcessLookupError:
          pass
    deadline = time.monotonic() + grace
    while grace and time.monotonic() < deadline and any(p.poll() is None for p in procs):
      time.sleep(0.05)
  for p in procs:
    p.wait()

def on_signal(signum, frame):  # srun forwards SIGINT / SIGTERM to the step
  terminate()
  sys.exit(128 + signum)
signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)

status = 0
while True:
  codes = [p.poll() for p in procs]
  bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
  if bad and not status:
    task, code = bad[0]
    status = 128 - code if code < 0 else code
    how = f"Killed by signal {{-code}}" if code < 0 else f"Exited with exit code {{code}}"
    sys.stderr.write(f"srun: error: {{node}}: task {{task}}: {{how}}\n")
    if kill_on_bad_exit:
      sys.stderr.write("srun: Terminating StepId=" + os.environ["SLURM_JOB_ID"] + ".0\n")
      terminate()
      break
  if all(c is not None for c in codes):
    break
  time.sleep(0.05)
for t in pumps:
  t.join(timeout=5)
sys.stdout.flush()
sys.exit(status)
'''


def _node_name():
  """This host's name as SLURM would list it, if it resolves here (JAX's coordinator is that name), else
  localhost."""
  name = socket.gethostname()
  try:
    socket.getaddrinfo(name, None)
  except OSError:
    return "localhost"
  return name


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _job_env(tmp_path, *, port, fake_python_dir=None):
  """What sbatch gives the batch script: the job's SLURM variables, the fake srun first on PATH; and the CPU
  set-up of `launch.local` (2 devices per task, Gloo collectives)."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  srun = bin_dir / "srun"
  srun.write_text(FAKE_SRUN.format(python=sys.executable))
  srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
  node = _node_name()
  path = [str(bin_dir)] + ([str(fake_python_dir)] if fake_python_dir else []) + [
      os.path.dirname(sys.executable), os.environ["PATH"]]
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_COORDINATOR", "JAX_NUM_PROC",
                                                                  "JAX_PROCESS_ID", "JAX_LOCAL_DEVICE"))}
  env.pop("JAXAGENT_COORDINATOR_BIND", None)
  env.update({
      "PATH": os.pathsep.join(path),
      "PYTHONPATH": os.pathsep.join([ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])),
      "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_JOB_NAME": "jaxagent", "SLURM_NTASKS": str(NTASKS),
      "SLURM_NPROCS": str(NTASKS), "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": node,
      "SLURM_NODELIST": node, "SLURM_TASKS_PER_NODE": str(NTASKS), "SLURM_SUBMIT_DIR": ROOT,
      "JAX_COORDINATOR_PORT": str(port),  # not the job id's: parallel runs must not clash
      "JAX_PLATFORMS": "cpu",
      "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES_PER_TASK}",
      "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
  })
  return env


def _sbatch(args, env):
  proc = subprocess.Popen(["bash", SBATCH, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
  lines = []
  threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
  return proc, lines


def _kill(proc):
  if proc.poll() is None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _main_args(workdir):
  # The same tiny text-only IL run as tests/launch/test_local_multiprocess.py (global batch 8: 4 per task, 2 per
  # device). The mesh names all 4 devices (`sharding.make_mesh` refuses any other count), so the run fails
  # unless the job sees both tasks' devices.
  return [f"--config={ROOT}/configs/il.py:smoke", f"--workdir={workdir}", "--config.model.kind=decoder",
          "--config.train.batch_size=8", f"--config.train.steps={STEPS}", "--config.checkpoint.every=1000",
          "--config.data.num_threads=1", f"--config.mesh.fsdp={NTASKS * DEVICES_PER_TASK}"]


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [(row["step"], row["loss"], row["loss_tokens"]) for row in map(json.loads, f)]


def _listeners(port):
  """The addresses something on this machine listens on at `port` (TCP)."""
  try:
    conns = psutil.net_connections("tcp")
  except psutil.AccessDenied:
    return None
  return {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def _is_loopback_or_own(ip, node):
  addr = ipaddress.ip_address(ip.split("%")[0])
  addr = getattr(addr, "ipv4_mapped", None) or addr
  own = {ipaddress.ip_address(a[4][0].split("%")[0]) for a in socket.getaddrinfo(node, None)}
  return not addr.is_unspecified and (addr.is_loopback or addr in own)


@pytest.mark.slow
def test_sbatch_script_runs_one_two_process_job_that_trains_like_one_process(tmp_path):
  port = _free_port()
  env = _job_env(tmp_path, port=port)
  slurm_dir, ref_dir = tmp_path / "slurm", tmp_path / "one"
  # The reference: one process owning all 4 devices, no jax.distributed, same global batch.
  ref_env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
  ref_env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={NTASKS * DEVICES_PER_TASK}"
  ref_log = tmp_path / "one.log"
  with open(ref_log, "w", encoding="utf-8") as log:  # concurrently with the job: two cores, mostly compile time
    ref = subprocess.Popen([sys.executable, "-m", "jaxagent.main", *_main_args(ref_dir)], cwd=ROOT, env=ref_env,
                           stdout=log, stderr=subprocess.STDOUT)
  # JAX's INFO log says where each task found the coordinator (and where task 0 started it): ~70 lines a task.
  job, lines = _sbatch(_main_args(slurm_dir), {**env, "JAX_LOGGING_LEVEL": "INFO"})
  listening = set()
  try:
    deadline = time.monotonic() + 600
    while job.poll() is None:
      assert time.monotonic() < deadline, "".join(lines)
      found = _listeners(port)
      if found:
        listening |= found
      time.sleep(0.2)
    ref.wait(timeout=600)
  finally:
    _kill(job)
    if ref.poll() is None:
      ref.kill()
  out = "".join(lines)
  assert job.returncode == 0, out[-6000:]
  assert ref.returncode == 0, ref_log.read_text()[-4000:]
  # Both tasks (labelled by srun) found the coordinator JAX's SLURM detection derives: the step's first node on
  # JAX_COORDINATOR_PORT; task 0 alone started it, and both connected and finished.
  coordinator = f"{env['SLURM_JOB_NODELIST']}:{port}"
  for task in range(NTASKS):
    mine = [l for l in lines if l.startswith(f"{task}: ")]
    assert any(f"Connecting to JAX distributed service on {coordinator}" in l for l in mine), out[-6000:]
    assert any("IL done: final checkpoint" in l for l in mine), out[-6000:]
    assert any(f"Starting JAX distributed service on {coordinator}" in l for l in mine) == (task == 0), out[-6000:]
  # One 2-process job of 4 devices: the metrics (appended to, so two 1-process jobs would write each step twice)
  # are written once, by process 0, with the 1 × 4 run's tokens and losses.
  ref_losses, got = _losses(ref_dir), _losses(slurm_dir)
  assert [s for s, _, _ in got] == list(range(1, STEPS + 1)), out[-4000:]
  assert [t for _, _, t in got] == [t for _, _, t in ref_losses]
  assert [l for _, l, _ in got] == pytest.approx([l for _, l, _ in ref_losses], abs=1e-5)
  assert ref_losses[0][1] != ref_losses[-1][1]  # it trained
  assert json.loads((slurm_dir / "config.json").read_text())["distributed"] is True
  assert (slurm_dir / "checkpoints" / str(STEPS)).is_dir()
  # The coordinator listened on this host only (jaxagent.main binds the name JAX derives), not every interface.
  if _listeners(port) is not None:  # psutil could read the machine's sockets
    assert listening, "the coordinator never listened on JAX_COORDINATOR_PORT"
    assert all(_is_loopback_or_own(ip, env["SLURM_JOB_NODELIST"]) for ip in listening), listening


_FAKE_PYTHON = r'''#!/bin/bash
# Stands in for `python -m jaxagent.main ...`: task 1 fails once task 0 is up; task 0 would run for minutes.
if [ "$SLURM_PROCID" = 1 ]; then
  while [ ! -s {pids}/0 ]; do sleep 0.05; done
  echo "task 1 failing"
  exit 3
fi
echo "task $SLURM_PROCID of $SLURM_NTASKS on $SLURM_STEP_NODELIST running"  # in the pipe before task 1 can fail
echo $$ > {pids}/$SLURM_PROCID.tmp && mv {pids}/$SLURM_PROCID.tmp {pids}/$SLURM_PROCID
exec sleep 300
'''


def test_one_task_failing_fails_the_job_and_kills_the_other(tmp_path):
  pids = tmp_path / "pids"
  pids.mkdir()
  fake_dir = tmp_path / "fakepython"
  fake_dir.mkdir()
  fake = fake_dir / "python"
  fake.write_text(_FAKE_PYTHON.format(pids=pids))
  fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
  env = _job_env(tmp_path, port=_free_port(), fake_python_dir=fake_dir)
  job, lines = _sbatch(["--config=configs/il.py:smoke", f"--workdir={tmp_path / 'w'}"], env)
  try:
    assert job.wait(timeout=60) == 3, "".join(lines)
  finally:
    _kill(job)
  time.sleep(0.2)
  out = "".join(lines)
  task0 = int((pids / "0").read_text())
  assert not psutil.pid_exists(task0) or psutil.Process(task0).status() == psutil.STATUS_ZOMBIE, out
  assert "0: task 0 of 2 on " in out and "1: task 1 failing" in out, out
  assert "task 1: Exited with exit code 3" in out, out
