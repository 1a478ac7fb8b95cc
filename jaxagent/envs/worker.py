"""The process side of `pool.EnvPool`: one fresh interpreter that builds one env and serves commands to it.

`EnvPool` starts it as `python -c "...worker.main(fd)"` with a socket on `fd`; it answers ("ready", pid), then
("ok", result) / ("rejected", why) / ("error", traceback) per command. Its own module so that a worker imports
the env registry and the process tracking, not the pool's parent-side machinery.
"""

from __future__ import annotations

from multiprocessing import connection as mp_connection
import os
import signal
import threading
import time
import traceback

from jaxagent.envs import registry
from jaxagent.envs.processes import MARKER_ENV, kill_marked

# What `EnvPool._start_worker` runs in the fresh interpreter.
CODE = "import sys; from jaxagent.envs.worker import main; main(int(sys.argv[1]))"


def _watch_parent(marker: str) -> None:
  """Kills this worker's descendants and exits when the pool's process disappears (even by SIGKILL)."""
  parent = os.getppid()
  while True:
    time.sleep(0.5)
    if os.getppid() != parent:
      kill_marked(marker)
      os._exit(1)


def main(fd: int) -> None:
  """Receives an env spec, builds the env, serves ("reset", task) / ("step", action) / ("close", None)."""
  conn = mp_connection.Connection(fd)
  marker = os.environ[MARKER_ENV]
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
  spec = conn.recv()
  threading.Thread(target=_watch_parent, args=(marker,), daemon=True).start()
  try:
    env = registry.make_env(spec)
  except BaseException:  # pylint: disable=broad-except
    conn.send(("error", "building the env failed:\n" + traceback.format_exc()))
    os._exit(1)
  conn.send(("ready", os.getpid()))
  while True:
    try:
      cmd, arg = conn.recv()
    except (EOFError, OSError):  # the pool went away
      kill_marked(marker)
      os._exit(0)
    if cmd == "close":
      try:
        env.close()
      finally:
        conn.send(("closed", None))
      return
    try:
      out = env.reset(arg) if cmd == "reset" else env.step(arg)
    except ValueError as e:
      if cmd == "reset":  # the env refused the task (bad input): retrying cannot help, the env is fine
        conn.send(("rejected", f"env.reset refused task {getattr(arg, 'id', arg)!r}: {e}"))
        continue
      conn.send(("error", f"env.{cmd} raised:\n" + traceback.format_exc()))
      os._exit(1)
    except BaseException:  # pylint: disable=broad-except
      conn.send(("error", f"env.{cmd} raised:\n" + traceback.format_exc()))
      os._exit(1)  # the parent kills what this env started and puts a fresh worker in the slot
    try:
      conn.send(("ok", out))
    except Exception:  # pylint: disable=broad-except  # e.g. an unpicklable object in `info`
      conn.send(("error", f"env.{cmd}'s result could not be sent:\n" + traceback.format_exc()))
      os._exit(1)
