"""Simulates a multi-host run on one machine: N local processes of `jaxagent.main`, each a JAX "host" with
its own CPU devices, joined by `jax.distributed` (collectives over Gloo).

    python -m launch.local --num_processes 2 --devices_per_process 4 -- \\
        --config=configs/il.py:smoke --workdir=/tmp/run --config.train.batch_size=8

Everything after `--` goes to `jaxagent.main` unchanged (plus `--config.distributed=True` when N > 1).
Each process gets `JAX_COORDINATOR_ADDRESS=127.0.0.1:<free port>`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`
(read by `jaxagent.main.init_distributed`) and `--xla_force_host_platform_device_count` in `XLA_FLAGS`.
Output lines are prefixed `[p<i>]`. One process failing stops the others (a peer blocked in a collective
would otherwise wait for the coordinator's heartbeat timeout); Ctrl-C / SIGTERM stops them all. The exit
status is the first failure's (128 + signal for a signal), else 0.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

_GRACE_S = 5.0  # SIGTERM → SIGKILL


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def process_env(base: dict, *, process_id: int, num_processes: int, devices_per_process: int,
                coordinator: str) -> dict:
  """The environment of one simulated host: CPU platform, its device count, its place in the job."""
  xla_flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", base.get("XLA_FLAGS", "")).strip()
  env = dict(base)
  env.update({
      "JAX_PLATFORMS": "cpu",
      "XLA_FLAGS": f"{xla_flags} --xla_force_host_platform_device_count={devices_per_process}".strip(),
      "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
      "JAX_COORDINATOR_ADDRESS": coordinator,
      "JAX_NUM_PROCESSES": str(num_processes),
      "JAX_PROCESS_ID": str(process_id),
      "PYTHONUNBUFFERED": "1",
  })
  return env


def _pump(stream, prefix: str, out) -> None:
  for line in iter(stream.readline, b""):
    out.write(prefix + line.decode("utf-8", "replace"))
    out.flush()
  stream.close()


def _stop(procs: list[subprocess.Popen]) -> None:
  """SIGTERM every live process group, SIGKILL what is left after the grace period."""
  for sig, wait_s in ((signal.SIGTERM, _GRACE_S), (signal.SIGKILL, 0.0)):
    live = [p for p in procs if p.poll() is None]
    for p in live:
      try:
        os.killpg(p.pid, sig)
      except ProcessLookupError:
        pass
    deadline = time.monotonic() + wait_s
    while wait_s and time.monotonic() < deadline and any(p.poll() is None for p in live):
      time.sleep(0.05)
  for p in procs:
    p.wait()


def _exit_status(returncode: int) -> int:
  return 128 - returncode if returncode < 0 else returncode


def launch(main_args: list[str], *, num_processes: int, devices_per_process: int,
           module: str = "jaxagent.main", out=None) -> int:
  """Runs `python -m module main_args` as `num_processes` JAX processes; returns the job's exit status."""
  if num_processes < 1 or devices_per_process < 1:
    raise ValueError(f"--num_processes={num_processes} and --devices_per_process={devices_per_process} "
                     "must be >= 1")
  out = out or sys.stdout
  coordinator = f"127.0.0.1:{free_port()}"
  args = list(main_args) + (["--config.distributed=True"] if num_processes > 1 else [])
  procs, pumps = [], []
  stopping = threading.Event()

  def on_signal(signum, frame):
    del frame
    stopping.set()
    out.write(f"[launch] signal {signum}: stopping all processes\n")

  old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
  status = 0
  try:
    for i in range(num_processes):
      env = process_env(os.environ, process_id=i, num_processes=num_processes,
                        devices_per_process=devices_per_process, coordinator=coordinator)
      # Own session: the launcher alone decides when children stop (and reaches their subprocesses).
      p = subprocess.Popen([sys.executable, "-m", module, *args], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, start_new_session=True)
      out.write(f"[launch] process {i}/{num_processes} pid {p.pid} ({devices_per_process} CPU devices, "
                f"coordinator {coordinator})\n")
      out.flush()
      procs.append(p)
      pumps.append(threading.Thread(target=_pump, args=(p.stdout, f"[p{i}] ", out), daemon=True))
      pumps[-1].start()
    while not stopping.is_set():
      codes = [p.poll() for p in procs]
      failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
      if failed:
        i, code = failed[0]
        out.write(f"[launch] process {i} exited with {code}: stopping the others\n")
        status = _exit_status(code)
        break
      if all(c == 0 for c in codes):
        break
      time.sleep(0.1)
    if stopping.is_set():
      status = 130
  finally:
    _stop(procs)
    for t in pumps:
      t.join(timeout=5)
    for s, h in old_handlers.items():
      signal.signal(s, h)
  out.flush()
  return status


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  ours, main_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
  parser = argparse.ArgumentParser(prog="python -m launch.local", description=__doc__.split("\n\n")[0])
  parser.add_argument("--num_processes", type=int, default=2, help="simulated hosts")
  parser.add_argument("--devices_per_process", type=int, default=4, help="CPU devices per host")
  parser.add_argument("--module", default="jaxagent.main", help="entry point run with `python -m`")
  flags = parser.parse_args(ours)
  if not main_args:
    parser.error("give jaxagent.main's flags after `--`, e.g. -- --config=configs/il.py:smoke --workdir=DIR")
  return launch(main_args, num_processes=flags.num_processes, devices_per_process=flags.devices_per_process,
                module=flags.module)


if __name__ == "__main__":
  sys.exit(main())
