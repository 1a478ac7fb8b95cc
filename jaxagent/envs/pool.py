"""A pool of environment subprocesses stepped together that survives its browsers' crashes and hangs.

Each slot is one worker process that owns one environment, hence one browser. Workers are fresh Python
interpreters (`python -c`, never `fork`: Playwright and JAX hold threads; and unlike multiprocessing's
`spawn` they do not re-import the caller's `__main__`, so a script without a `__main__` guard works).
`reset`, `step` and `advance` address any subset of slots; the commands go out to all of them first and the
answers are gathered as they come, so N browsers work in parallel.

A worker whose env raises (e.g. `BrowserCrashed`), whose process dies, or which does not answer within the
timeout is killed together with everything it started, and a fresh worker takes its slot. The episode it was
running is retried from `reset` up to `max_retries` times (the caller gets `SlotResult.restarted` with the
new first observation), then given up (`SlotResult.errored`). Nothing is silently lost. A task the env
refuses (`ValueError` from `reset`: bad input, not a crash) is errored at once, without retries.

A worker and the processes it starts (the Playwright driver, the Chromium browser process) carry the
environment variable `JAXAGENT_ENV_WORKER=<pool>/<slot>/<generation>`. Playwright puts Chromium in a session
of its own, so the worker's process group does not hold it; the marker, read from `/proc/<pid>/environ`,
finds it even after the worker died and its children were re-parented, and Chromium's zygotes and renderers
(which drop the marker) share its session. Killing a worker, and `close()` (also via the context manager,
`atexit`, and SIGTERM or Ctrl-C in the parent), kill every marked process and its session, so no Chromium
outlives the pool. Workers also watch their parent and do the same if it dies without closing the pool.

By concern: the worker's side is `worker.py`, the marker and the killing `processes.py`, and
`backends.make_pool` picks this pool or Ray's (`ray_pool.RayEnvPool`, built on this one) from `config.env`.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
from multiprocessing import connection as mp_connection
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Mapping, Sequence
import uuid
import weakref

from jaxagent import types
from jaxagent.envs import registry, tempdirs, worker
# The process tracking (`processes`) and the worker's side (`worker`) have modules of their own; `MARKER_ENV` and
# `marked_pids` stay importable from here, where tests and tools look for them.
from jaxagent.envs.processes import MARKER_ENV, kill_marked, marked_pids  # noqa: F401


@dataclasses.dataclass
class SlotResult:
  """One slot's answer to `reset` or `step`."""

  obs: types.Observation | None
  reward: float = 0.0
  done: bool = False
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  restarted: bool = False  # this attempt crashed; `obs` is the first observation of the episode run again
  errored: bool = False  # crashed on all 1 + max_retries attempts (or the env refused the task); `obs` is None
  attempt: int = 1  # which attempt of the slot's current episode produced this result
  errors: list[str] = dataclasses.field(default_factory=list)  # why each failed attempt failed


# --------------------------------------------------------------------------------------------- the pool


@dataclasses.dataclass
class _Worker:
  process: subprocess.Popen
  conn: mp_connection.Connection
  marker: str
  ready: bool = False


@dataclasses.dataclass
class _Episode:
  task: types.Task
  attempt: int = 1
  errors: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Pending:
  cmd: str  # "reset" | "step" | "retry"
  timeout: float
  deadline: float


_LIVE_POOLS: "weakref.WeakSet[EnvPool]" = weakref.WeakSet()
_HOOKS_INSTALLED = False


def _close_live_pools() -> None:
  for pool in list(_LIVE_POOLS):
    pool.close()


def _on_sigterm(previous):
  def handler(signum, frame):
    _close_live_pools()
    if callable(previous):
      previous(signum, frame)
    else:  # SIG_DFL: die of SIGTERM as we would have
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
  return handler


def _install_exit_hooks() -> None:
  global _HOOKS_INSTALLED
  if _HOOKS_INSTALLED:
    return
  _HOOKS_INSTALLED = True
  atexit.register(_close_live_pools)
  if threading.current_thread() is threading.main_thread():
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_IGN:
      signal.signal(signal.SIGTERM, _on_sigterm(previous))


class EnvPool:
  """`num_workers` env subprocesses built from `spec` (see `registry.make_env`), stepped in parallel.

  Usage:
    with EnvPool({"kind": "miniwob"}, num_workers=4) as pool:
      first = pool.reset([task_a, task_b, None, task_c])   # None: leave that slot alone
      nxt = pool.step({0: action_a, 3: action_c})          # or a dict slot -> command
  Both return a list with one `SlotResult` per addressed slot (None elsewhere).
  """

  def __init__(self, spec: Mapping[str, Any], num_workers: int, step_timeout: float = 30.0,
               reset_timeout: float = 60.0, max_retries: int = 2, start_timeout: float = 120.0,
               close_timeout: float = 10.0):
    self._set_up(spec, num_workers, step_timeout, reset_timeout, max_retries, start_timeout, close_timeout)
    _install_exit_hooks()
    _LIVE_POOLS.add(self)
    self._workers = [self._start_worker(i) for i in range(num_workers)]
    try:
      self._wait_ready()
    except BaseException:
      self.close()
      raise

  def _set_up(self, spec, num_workers: int, step_timeout: float, reset_timeout: float, max_retries: int,
              start_timeout: float, close_timeout: float) -> None:
    """The bookkeeping every pool backend keeps, its arguments checked; no worker started yet."""
    if num_workers < 1:
      raise ValueError(f"{type(self).__name__}: num_workers={num_workers} must be >= 1")
    if max_retries < 0:
      raise ValueError(f"{type(self).__name__}: max_retries={max_retries} must be >= 0")
    self.spec = registry.resolve(spec)  # a kind registered here means nothing to another process or node
    self.num_workers = num_workers
    self.step_timeout = step_timeout
    self.reset_timeout = reset_timeout
    self.start_timeout = start_timeout
    self.close_timeout = close_timeout
    self.max_retries = max_retries
    self.restarts = 0  # workers replaced after a crash or hang
    self.failures: list[str] = []  # every failure seen, "slot i attempt k: why"
    self._id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    self._generation = itertools.count()
    self._episodes: list[_Episode | None] = [None] * num_workers
    self._closed = False
    self._in_round = False  # commands in flight: close() then kills at once instead of asking workers

  # -- public API

  @property
  def marker(self) -> str:
    """The prefix of the `JAXAGENT_ENV_WORKER` marker every process of this pool carries."""
    return self._id

  def __len__(self) -> int:
    return self.num_workers

  def __del__(self):
    try:
      self.close()
    except Exception:  # pylint: disable=broad-except  # interpreter shutdown
      pass

  def __enter__(self) -> "EnvPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def worker_pid(self, slot: int) -> int:
    return self._workers[slot].process.pid

  def reset(self, tasks: Sequence[types.Task | None] | Mapping[int, types.Task]) -> list[SlotResult | None]:
    """Starts a new episode of `tasks[i]` in slot i (a new task resets the slot's retry count)."""
    return self.advance(resets=self._as_commands(tasks, "tasks"))

  def step(self, actions: Sequence[types.Action | None] | Mapping[int, types.Action]) -> list[SlotResult | None]:
    """Executes `actions[i]` in slot i; a crash there restarts the slot's episode (see `SlotResult`)."""
    return self.advance(steps=self._as_commands(actions, "actions"))

  def advance(self, resets: Mapping[int, types.Task] | None = None,
              steps: Mapping[int, types.Action] | None = None) -> list[SlotResult | None]:
    """Resets some slots and steps others in ONE parallel round (a collector refills finished slots
    while the rest keep stepping)."""
    resets, steps = dict(resets or {}), dict(steps or {})
    both = sorted(set(resets) & set(steps))
    if both:
      raise ValueError(f"EnvPool.advance: slot(s) {both} given both a task and an action")
    self._as_commands({**resets, **steps}, "commands")  # validates slot numbers
    for slot in steps:
      if self._episodes[slot] is None:
        raise RuntimeError(f"EnvPool.step: slot {slot} has no episode running; call reset with a task first")
    for slot, task in resets.items():
      self._episodes[slot] = _Episode(task)
    commands = {slot: ("reset", task) for slot, task in resets.items()}
    commands.update({slot: ("step", action) for slot, action in steps.items()})
    return self._run(commands)

  def close(self) -> None:
    """Stops every worker and kills whatever they started; safe to call twice."""
    if self._closed:
      return
    self._closed = True
    _LIVE_POOLS.discard(self)
    workers = getattr(self, "_workers", [])
    if not self._in_round:  # idle workers close their envs (browsers) themselves first
      for w in workers:
        try:
          w.conn.send(("close", None))
        except (OSError, ValueError):
          pass
      deadline = time.monotonic() + self.close_timeout
      for w in workers:
        try:
          w.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
          pass
    for w in workers:
      self._kill(w)
    kill_marked(self._id)
    tempdirs.sweep_stale()  # the temp roots of workers that were killed rather than closed

  # -- internals

  def _as_commands(self, items, name) -> dict[int, Any]:
    if self._closed:
      raise RuntimeError("EnvPool is closed")
    if isinstance(items, Mapping):
      commands = dict(items)
    else:
      if len(items) != self.num_workers:
        raise ValueError(f"EnvPool: got {len(items)} {name} for {self.num_workers} slots; pass one per slot "
                         "(None to skip a slot) or a dict slot -> item")
      commands = {i: x for i, x in enumerate(items) if x is not None}
    bad = [s for s in commands if not 0 <= s < self.num_workers]
    if bad:
      raise ValueError(f"EnvPool: {name} for slot(s) {bad}; slots are 0..{self.num_workers - 1}")
    return commands

  def _start_worker(self, slot: int) -> _Worker:
    marker = f"{self._id}/{slot}/{next(self._generation)}"
    parent_sock, child_sock = socket.socketpair()
    env = {**os.environ, MARKER_ENV: marker,
           "PYTHONPATH": os.pathsep.join(os.path.abspath(p or os.curdir) for p in sys.path)}
    try:
      process = subprocess.Popen([sys.executable, "-c", worker.CODE, str(child_sock.fileno())], env=env,
                                 pass_fds=[child_sock.fileno()], start_new_session=True)
    finally:
      child_sock.close()
    conn = mp_connection.Connection(parent_sock.detach())
    conn.send(self.spec)
    return _Worker(process, conn, marker)

  def _kill(self, w: _Worker) -> None:
    try:
      os.kill(w.process.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    kill_marked(w.marker)
    try:
      w.process.wait(5)
    except subprocess.TimeoutExpired:
      pass
    w.conn.close()

  def _wait_ready(self) -> None:
    deadline = time.monotonic() + self.start_timeout
    for slot, w in enumerate(self._workers):
      remaining = max(0.0, deadline - time.monotonic())
      if not w.conn.poll(remaining):
        raise TimeoutError(f"EnvPool: worker {slot} did not build its env within start_timeout="
                           f"{self.start_timeout}s")
      try:
        kind, payload = w.conn.recv()
      except EOFError:
        raise RuntimeError(f"EnvPool: worker {slot} died while building env {self.spec}") from None
      if kind != "ready":
        raise RuntimeError(f"EnvPool: worker {slot} could not build env {self.spec}:\n{payload}")
      w.ready = True

  def _send(self, slot: int, cmd: str, arg: Any, pending: dict[int, _Pending]) -> None:
    w = self._workers[slot]
    timeout = self.reset_timeout if cmd in ("reset", "retry") else self.step_timeout
    # A fresh worker first builds its env (launches a browser): its clock starts at "ready".
    wait = timeout if w.ready else timeout + self.start_timeout
    pending[slot] = _Pending(cmd, timeout, time.monotonic() + wait)
    try:
      w.conn.send(("reset" if cmd == "retry" else cmd, arg))
    except (OSError, ValueError):  # the worker is already dead; the wait loop sees it
      pass

  def _run(self, commands: dict[int, tuple[str, Any]]) -> list[SlotResult | None]:
    results: list[SlotResult | None] = [None] * self.num_workers
    pending: dict[int, _Pending] = {}
    self._in_round = True
    try:
      for slot, (cmd, arg) in commands.items():
        self._send(slot, cmd, arg, pending)
      while pending:
        self._wait(pending, max(0.0, min(p.deadline for p in pending.values()) - time.monotonic()))
        for slot in list(pending):
          self._poll(slot, pending, results)
    except BaseException:  # Ctrl-C mid-round: answers are still in flight, the pool cannot be reused
      self.close()
      raise
    finally:
      self._in_round = False
    return results

  def _wait(self, pending: dict[int, "_Pending"], timeout: float) -> None:
    """Blocks until a pending slot may have news, or `timeout` s. A dead worker's socket reads EOF, so waiting
    on the connections also catches deaths."""
    mp_connection.wait([self._workers[s].conn for s in pending], timeout=timeout)

  def _answer(self, slot: int, kind: str, payload: Any, pending: dict[int, "_Pending"],
              results: list[SlotResult | None]) -> None:
    """A worker's answer to its slot's pending command, into `results` (an error restarts the episode)."""
    p = pending[slot]
    if kind == "error":
      return self._fail(slot, payload, pending, results)
    ep = self._episodes[slot]
    del pending[slot]
    if kind == "rejected":  # the task itself is bad: no retry, the worker stays
      self.failures.append(f"slot {slot} attempt {ep.attempt}: {payload}")
      results[slot] = SlotResult(None, errored=True, attempt=ep.attempt, errors=[*ep.errors, payload])
      self._episodes[slot] = None
    elif p.cmd == "step":
      obs, reward, done, info = payload
      results[slot] = SlotResult(obs, float(reward), bool(done), dict(info or {}), attempt=ep.attempt,
                                 errors=list(ep.errors))
    else:
      results[slot] = SlotResult(payload, restarted=p.cmd == "retry", attempt=ep.attempt, errors=list(ep.errors))
    return None

  def _poll(self, slot: int, pending: dict[int, _Pending], results: list[SlotResult | None]) -> None:
    w, p = self._workers[slot], pending[slot]
    while True:  # drain: a "ready" may come before the answer
      try:
        if not w.conn.poll():
          break
        kind, payload = w.conn.recv()
      except (EOFError, OSError):
        return self._fail(slot, f"worker process died (exit code {self._exitcode(w)}) during {p.cmd}",
                          pending, results)
      if kind == "ready":
        w.ready = True
        p.deadline = time.monotonic() + p.timeout
        continue
      return self._answer(slot, kind, payload, pending, results)
    if w.process.poll() is not None:
      return self._fail(slot, f"worker process died (exit code {self._exitcode(w)}) during {p.cmd}",
                        pending, results)
    if time.monotonic() > p.deadline:
      return self._fail(slot, f"{p.cmd} did not answer within {p.timeout}s (hung); killed", pending, results)
    return None

  @staticmethod
  def _exitcode(w: _Worker) -> Any:
    try:
      return w.process.wait(0.5)
    except subprocess.TimeoutExpired:
      return None

  def _fail(self, slot: int, why: str, pending: dict[int, _Pending], results: list[SlotResult | None]) -> None:
    ep = self._episodes[slot]
    why = why.strip()
    self.failures.append(f"slot {slot} attempt {ep.attempt}: {why}")
    ep.errors.append(f"attempt {ep.attempt}: {why}")
    self._kill(self._workers[slot])
    self._workers[slot] = self._start_worker(slot)
    self.restarts += 1
    if ep.attempt > self.max_retries:
      del pending[slot]
      results[slot] = SlotResult(None, errored=True, attempt=ep.attempt, errors=list(ep.errors))
      self._episodes[slot] = None
      return
    ep.attempt += 1
    self._send(slot, "retry", ep.task, pending)
