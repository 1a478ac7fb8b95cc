"""The processes an env worker started, found and killed by the marker they inherit.

A pool's worker (a subprocess of `pool.EnvPool`, or a Ray actor of `ray_pool.RayEnvPool`) and every process it
starts (the Playwright driver, Chromium) carry the environment variable `JAXAGENT_ENV_WORKER=<pool>/<slot>/<gen>`.
Read from `/proc/<pid>/environ`, it finds them even after the worker died and its children were re-parented;
Chromium's zygotes and renderers drop it but stay in the browser's session. Its own module because both pool
backends and the Ray actors' guardian process use it, and the guardian should import nothing else.
"""

from __future__ import annotations

import os
import signal
import time

MARKER_ENV = "JAXAGENT_ENV_WORKER"


def _marker_of(pid: int) -> str | None:
  try:
    with open(f"/proc/{pid}/environ", "rb") as f:
      env = f.read()
  except OSError:  # gone, or a zombie, or not ours
    return None
  key = MARKER_ENV.encode() + b"="
  for item in env.split(b"\0"):
    if item.startswith(key):
      return item[len(key):].decode(errors="replace")
  return None


def marked_pids(prefix: str) -> list[int]:
  """Live processes whose `JAXAGENT_ENV_WORKER` marker equals `prefix` or starts with `prefix + "/"`."""
  me = os.getpid()
  out = []
  for entry in os.scandir("/proc"):
    if not entry.name.isdigit() or int(entry.name) == me:
      continue
    marker = _marker_of(int(entry.name))
    if marker is not None and (marker == prefix or marker.startswith(prefix + "/")):
      out.append(int(entry.name))
  return out


def _session_of(pid: int) -> int | None:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return int(f.read().rsplit(")", 1)[1].split()[3])  # state ppid pgrp session
  except (OSError, IndexError, ValueError):
    return None


def _same_session(sessions: set[int]) -> list[int]:
  """Processes in one of `sessions`: Chromium's zygotes and renderers drop the marker but keep the session
  Playwright started the browser in."""
  return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and _session_of(int(e.name)) in sessions]


def kill_marked(prefix: str, rounds: int = 5) -> None:
  """SIGKILLs marked processes and their sessions until none is left (a dying browser may still fork)."""
  own = {os.getsid(0)}
  for _ in range(rounds):
    pids = marked_pids(prefix)
    if not pids:
      return
    sessions = {s for s in map(_session_of, pids) if s is not None} - own
    pids = set(pids) | set(_same_session(sessions))
    pids.discard(os.getpid())
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    time.sleep(0.05)
