"""A Ray rollout fleet: `EnvPool`'s slots served by Ray actors, so one collection spreads over many machines.

`RayEnvPool` is an `EnvPool` (same `reset` / `step` / `advance`, same `SlotResult` bookkeeping, retries and
errors) whose slot workers are Ray actors, each holding one env (one browser) on whichever node Ray places it.
`advance` sends every command first, then gathers the answers with `ray.wait` under the per-command timeout. An
actor that dies (`RayActorError`: its process was killed, its node went away), does not answer in time, or
whose env raises, is killed and replaced by a fresh actor, and its episode restarted, as `EnvPool` does.

A Ray actor killed outright cannot clean up, and Chromium runs in a session of its own, so each actor starts a
small guardian process on its own node before it builds its env: it carries the actor's `JAXAGENT_ENV_WORKER`
marker, watches the actor and, once the actor is gone, kills every process carrying the marker
(`processes.kill_marked`). The guardian is neither in the actor's process group nor its child (Ray kills both when a
worker dies) but stays in the actor's session, which is also the raylet's: the sweep spares its own session, so
it never reaches Ray's processes. For the same reason the driver never kills processes by marker itself.

`address=""` starts a private Ray instance on this machine whose every server listens on 127.0.0.1 only;
`"auto"`, `"host:port"` or `"ray://host:10001"` join a running cluster. A process already connected to Ray
(`ray.init` was called) keeps that connection and `address` is ignored.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, Mapping

try:
  import ray
  from ray._private import ray_constants
except ImportError as e:  # Ray is an optional extra
  raise ImportError("config.env.backend='ray' needs Ray on the driver and on every worker machine: "
                    "pip install 'jaxagent[ray]'") from e

from jaxagent import types
from jaxagent.envs import registry, tempdirs
from jaxagent.envs.pool import EnvPool, SlotResult, _Pending, _LIVE_POOLS, _install_exit_hooks
from jaxagent.envs.processes import MARKER_ENV, marked_pids

# Ray picks a routable address for a node unless multi-node clusters are switched off (the flag's name says
# Windows/OSX, but it is read on every platform); off, the node's servers listen on 127.0.0.1.
_CLUSTER_FLAG = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# The guardian: Ray kills a dead worker's process group and its child processes, so the guardian leaves the
# actor's group and, forking once more, stops being its child; it stays in the actor's session. It says when it
# is armed (the actor waits for that), then sweeps the actor's marker once the actor is gone.
_GUARD_CODE = """import os, sys, time
os.setpgid(0, 0)
if os.fork():
  os._exit(0)
import psutil
try:
  actor = psutil.Process(int(sys.argv[1]))
except psutil.NoSuchProcess:
  actor = None
print("armed", flush=True)
from jaxagent.envs.processes import kill_marked
while actor is not None and actor.is_running() and actor.status() != psutil.STATUS_ZOMBIE:
  time.sleep(0.5)
kill_marked(sys.argv[2])
"""

# ---------------------------------------------------------------------------------------- the connection

_ray_users = 0  # open pools using the connection
_ray_connected_here = False  # this module called ray.init: the last pool to close disconnects (a local Ray stops)


def start_local_ray(num_cpus: int | None = None) -> None:
  """Starts a Ray instance on this machine reachable on loopback only, its workers importing what this process
  imports (this process's `sys.path`, as `EnvPool`'s workers do)."""
  previous = os.environ.get(_CLUSTER_FLAG)
  os.environ[_CLUSTER_FLAG] = "0"  # inherited by the GCS, the raylet and so every worker it starts
  enabled, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False  # read at import
  try:
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"PYTHONPATH": _pythonpath()}})
  finally:
    ray_constants.ENABLE_RAY_CLUSTER = enabled
    if previous is None:
      del os.environ[_CLUSTER_FLAG]
    else:
      os.environ[_CLUSTER_FLAG] = previous


def _pythonpath() -> str:
  return os.pathsep.join(os.path.abspath(p or os.curdir) for p in sys.path)


def _acquire_ray(address: str, num_cpus: int) -> None:
  global _ray_users, _ray_connected_here
  if not ray.is_initialized():
    if address in ("", "local"):
      start_local_ray(num_cpus)
    else:
      _connect(address)
    _ray_connected_here = True
  _ray_users += 1


def _connect(address: str, attempts: int = 3, backoff_s: float = 2.0) -> None:
  """`ray.init(address)`, retried: a Ray client server on a loaded head can abort a connection while it starts
  the client's own server process (`ConnectionAbortedError: Initialization failure from server`)."""
  for attempt in range(1, attempts + 1):
    try:
      ray.init(address=address)
      return
    except ConnectionAbortedError:
      if attempt == attempts:
        raise
      time.sleep(backoff_s * attempt)


def _release_ray() -> None:
  global _ray_users, _ray_connected_here
  _ray_users = max(0, _ray_users - 1)
  if _ray_users == 0 and _ray_connected_here:
    _ray_connected_here = False
    ray.shutdown()


# --------------------------------------------------------------------------------------------- the actor


@ray.remote(max_restarts=0, max_task_retries=0)  # the pool restarts workers itself, with a fresh episode
class _EnvActor:
  """One env in a Ray worker process. Answers ("ok", out), ("rejected", why) for a task `reset` refuses (a
  `ValueError`: bad input, the env is fine), or ("error", traceback) like `pool.py`'s subprocess worker."""

  def __init__(self, spec: Mapping[str, Any], marker: str):
    os.environ[MARKER_ENV] = marker  # inherited by what the env starts (Playwright's driver, Chromium)
    guardian = subprocess.Popen([sys.executable, "-c", _GUARD_CODE, str(os.getpid()), marker],
                                env={**os.environ, "PYTHONPATH": _pythonpath()}, stdout=subprocess.PIPE)
    armed = guardian.stdout.readline() == b"armed\n"
    guardian.wait()  # the guardian's first process exits at once, its fork goes on
    guardian.stdout.close()
    if not armed:
      raise RuntimeError(f"the guardian process of env worker {marker} did not start")
    self.env = registry.make_env(spec)

  def ready(self) -> tuple[int, str]:
    return os.getpid(), socket.gethostname()

  def reset(self, task: types.Task) -> tuple[str, Any]:
    try:
      return "ok", self.env.reset(task)
    except ValueError as e:
      return "rejected", f"env.reset refused task {getattr(task, 'id', task)!r}: {e}"
    except BaseException:  # pylint: disable=broad-except
      return "error", "env.reset raised:\n" + traceback.format_exc()

  def step(self, action: types.Action) -> tuple[str, Any]:
    try:
      return "ok", self.env.step(action)
    except BaseException:  # pylint: disable=broad-except
      return "error", "env.step raised:\n" + traceback.format_exc()

  def close(self) -> None:
    self.env.close()


# ---------------------------------------------------------------------------------------------- the pool


@dataclasses.dataclass
class _Actor:
  handle: Any  # ray.actor.ActorHandle
  marker: str
  ready_ref: Any  # ray.ObjectRef of `ready()`: resolves once the env is built
  ready: bool = False
  pid: int | None = None
  host: str = ""
  answer: Any = None  # ray.ObjectRef of the command in flight


def _done(ref) -> bool:
  return bool(ray.wait([ref], timeout=0)[0])


def _why(e: BaseException) -> str:
  return f"{type(e).__name__}: {e}".strip()


class RayEnvPool(EnvPool):
  """`num_workers` Ray actors, each holding one env built from `spec` (see `registry.make_env`).

  The public surface and `SlotResult` semantics are `EnvPool`'s; only where a slot's worker runs differs.
  `worker_cpus` is the Ray CPU resource each actor holds (fractions are fine): on a cluster it decides how many
  browsers share a node. Each worker machine needs this package and Chromium installed.
  """

  # pylint: disable-next=super-init-not-called  # EnvPool.__init__ starts subprocesses; the state is the same
  def __init__(self, spec: Mapping[str, Any], num_workers: int, step_timeout: float = 30.0,
               reset_timeout: float = 60.0, max_retries: int = 2, start_timeout: float = 120.0,
               close_timeout: float = 10.0, *, address: str = "", worker_cpus: float = 1.0):
    if worker_cpus <= 0:
      raise ValueError(f"RayEnvPool: worker_cpus={worker_cpus} must be > 0")
    self._set_up(spec, num_workers, step_timeout, reset_timeout, max_retries, start_timeout, close_timeout)
    self.worker_cpus = worker_cpus
    self._workers: list[_Actor] = []
    self._closed = True  # until Ray is connected: close() has nothing to release
    # A local instance declares enough CPUs for every actor (they mostly wait on their browsers).
    _acquire_ray(address, max(os.cpu_count() or 1, math.ceil(num_workers * worker_cpus)))
    self._closed = False
    _install_exit_hooks()
    _LIVE_POOLS.add(self)
    try:
      self._workers = [self._start_worker(i) for i in range(num_workers)]
      self._wait_ready()
    except BaseException:
      self.close()
      raise

  # -- public API beyond EnvPool's

  def worker_pid(self, slot: int) -> int:
    """The pid of slot `slot`'s actor process, on the node `worker_host(slot)`."""
    return self._ensure_ready(slot).pid

  def worker_host(self, slot: int) -> str:
    return self._ensure_ready(slot).host

  def close(self) -> None:
    """Closes every env, kills every actor, waits for this machine's guardians to sweep; safe to call twice."""
    if self._closed:
      return
    self._closed = True
    _LIVE_POOLS.discard(self)
    try:
      if ray.is_initialized():
        if not self._in_round and self._workers:  # idle actors close their envs (browsers) themselves first
          refs = [w.handle.close.remote() for w in self._workers]
          ray.wait(refs, num_returns=len(refs), timeout=self.close_timeout)
        for w in self._workers:
          self._kill(w)
    finally:
      deadline = time.monotonic() + 5.0  # the guardians notice within 0.5 s
      while marked_pids(self._id) and time.monotonic() < deadline:
        time.sleep(0.1)
      tempdirs.sweep_stale()
      _release_ray()

  # -- internals (EnvPool's `advance` and `_fail` drive these)

  def _start_worker(self, slot: int) -> _Actor:
    marker = f"{self._id}/{slot}/{next(self._generation)}"
    handle = _EnvActor.options(num_cpus=self.worker_cpus).remote(self.spec, marker)
    return _Actor(handle, marker, handle.ready.remote())

  def _kill(self, w: _Actor) -> None:
    """Ends the actor; its guardian then kills what its env started, on its node."""
    try:
      ray.kill(w.handle, no_restart=True)
    except Exception:  # pylint: disable=broad-except  # already gone
      pass
    w.answer = None

  def _mark_ready(self, w: _Actor, timeout: float | None = None) -> None:
    w.pid, w.host = ray.get(w.ready_ref, timeout=timeout)
    w.ready = True

  def _ensure_ready(self, slot: int) -> _Actor:
    w = self._workers[slot]
    if not w.ready:
      self._mark_ready(w, self.start_timeout)
    return w

  def _wait_ready(self) -> None:
    deadline = time.monotonic() + self.start_timeout
    for slot, w in enumerate(self._workers):
      if not ray.wait([w.ready_ref], timeout=max(0.0, deadline - time.monotonic()))[0]:
        raise TimeoutError(f"RayEnvPool: worker {slot} did not build its env within start_timeout="
                           f"{self.start_timeout}s; does the cluster have {self.worker_cpus} free CPU per worker "
                           f"for {self.num_workers} workers (`ray status`)?")
      try:
        self._mark_ready(w)
      except Exception as e:  # pylint: disable=broad-except
        raise RuntimeError(f"RayEnvPool: worker {slot} could not build env {self.spec}: {_why(e)}") from None

  def _send(self, slot: int, cmd: str, arg: Any, pending: dict[int, _Pending]) -> None:
    w = self._workers[slot]
    timeout = self.reset_timeout if cmd in ("reset", "retry") else self.step_timeout
    # A fresh actor first builds its env (launches a browser): its clock starts once it is ready.
    wait = timeout if w.ready else timeout + self.start_timeout
    pending[slot] = _Pending(cmd, timeout, time.monotonic() + wait)
    w.answer = (w.handle.step if cmd == "step" else w.handle.reset).remote(arg)

  def _awaited(self, slot: int) -> list[Any]:
    w = self._workers[slot]
    return [w.answer] if w.ready else [w.ready_ref, w.answer]

  def _wait(self, pending: dict[int, _Pending], timeout: float) -> None:
    ray.wait([ref for s in pending for ref in self._awaited(s)], num_returns=1, timeout=timeout)

  def _poll(self, slot: int, pending: dict[int, _Pending], results: list[SlotResult | None]) -> None:
    w, p = self._workers[slot], pending[slot]
    if not w.ready and _done(w.ready_ref):
      try:
        self._mark_ready(w)
      except Exception as e:  # pylint: disable=broad-except  # the env could not be built, or the actor died
        return self._fail(slot, f"worker actor died before its env was ready: {_why(e)}", pending, results)
      p.deadline = time.monotonic() + p.timeout
    if not _done(w.answer):
      if time.monotonic() > p.deadline:
        return self._fail(slot, f"{p.cmd} did not answer within {p.timeout}s (hung); killed", pending, results)
      return None
    try:
      kind, payload = ray.get(w.answer)
    except ray.exceptions.RayActorError as e:
      return self._fail(slot, f"worker actor died during {p.cmd}: {_why(e)}", pending, results)
    except Exception as e:  # pylint: disable=broad-except  # e.g. the answer could not be serialized
      return self._fail(slot, f"{p.cmd} failed in its actor: {_why(e)}", pending, results)
    return self._answer(slot, kind, payload, pending, results)
