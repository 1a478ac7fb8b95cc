"""Asynchronous collection: an online recipe's rollouts run in a background thread while its learner trains.

An online recipe alternates collect(round i, actor) → train → actor for round i + 1. With `max_lag` L > 0, round i
is collected with actor `behaviour_version(i, L) = max(0, i - L)` instead of the newest one, so it can run as soon
as that actor is published, while the learner is still training the next ones: collection overlaps training, and
every sample is at most L actor updates behind the actor that trains on it (the bounded staleness of AReaL and of
one-step off-policy PPO). L = 0 is the synchronous alternation the originals run.

The schedule is fixed by the round alone, not by which thread is faster, so a run is reproducible and a killed
run resumes each round with the actor it started with. Rounds run one after another in one collector thread
(the env pool is shared by the rounds); a round whose stage is finished already (a resumed run) is skipped.
With L = 0 there is no thread: `result(i)` collects round i in the caller's thread, exactly the synchronous loop.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


def behaviour_version(round_index: int, max_lag: int) -> int:
  """The actor version that collects round `round_index`: the newest one at most `max_lag` updates old when
  round i is trained (actor i is the one trained on rounds < i; actor 0 is the start)."""
  if max_lag < 0:
    raise ValueError(f"max_lag={max_lag}: the policy lag bound must be >= 0 (0 = synchronous)")
  return max(0, round_index - max_lag)


def _process_count() -> int:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_count()


class AsyncCollector:
  """Runs `collect(i, actor)` for rounds 0..n-1 in a background thread, each once its actor is published.

  The learner calls `publish(version, actor)` when actor `version` exists (`publish(0, start)` first) and
  `result(i)` for round i's summary (blocking until it is collected; a round's exception is raised there).
  `done(i)` says a round needs no collecting (its stage finished in an earlier run). With `gated`, round i also
  waits for `allow(i)`: the learner's signal that what the round reads besides its actor exists (WebRL's next
  tasks come from this phase's failures and critic).

      with AsyncCollector(collect, n, max_lag, done=...) as collector:
        collector.publish(0, start)
        for i in range(n):
          summary = collector.result(i)
          actor = train(...)
          collector.publish(i + 1, actor)
  """

  def __init__(self, collect: Callable[[int, Any], Any], rounds: int, max_lag: int,
               done: Callable[[int], bool] = lambda i: False, gated: bool = False):
    self.collect, self.rounds, self.max_lag, self.done = collect, int(rounds), int(max_lag), done
    self.gated = bool(gated)
    self._allowed: set[int] = set()
    behaviour_version(0, self.max_lag)  # validates max_lag
    if self.max_lag > 0 and _process_count() > 1:
      raise ValueError(f"max_lag={self.max_lag} with {_process_count()} processes: the collector thread's "
                       "barriers would interleave with the learner's collectives; set the recipe's max_lag to 0")
    self._actors: dict[int, Any] = {}
    self._results: dict[int, tuple[bool, Any]] = {}
    self._cond = threading.Condition()
    self._closed = False
    self._thread = None
    if self.max_lag > 0:
      self._thread = threading.Thread(target=self._run, name="async-collect", daemon=True)
      self._thread.start()

  def __enter__(self) -> "AsyncCollector":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def version(self, round_index: int) -> int:
    return behaviour_version(round_index, self.max_lag)

  def lag(self, round_index: int) -> int:
    """How many actor updates round `round_index`'s behaviour actor is behind the actor trained on it."""
    return round_index - self.version(round_index)

  def publish(self, version: int, actor: Any) -> None:
    with self._cond:
      self._actors[int(version)] = actor
      self._cond.notify_all()

  def allow(self, round_index: int) -> None:
    """(gated) Round `round_index` may start once its actor is published."""
    with self._cond:
      self._allowed.add(int(round_index))
      self._cond.notify_all()

  def _ready(self, i: int) -> bool:
    return self.version(i) in self._actors and (not self.gated or i in self._allowed)

  def result(self, round_index: int) -> Any:
    """Round `round_index`'s summary, once collected."""
    if self._thread is None:  # synchronous: collect it here, with the actor published for it
      if not self._ready(round_index):
        raise RuntimeError(f"round {round_index} needs actor {self.version(round_index)}"
                           f"{' and allow()' if self.gated else ''}, which the learner has not given")
      return self.collect(round_index, self._actors[self.version(round_index)])
    with self._cond:
      while round_index not in self._results:
        if not self._thread.is_alive():
          raise RuntimeError(f"the collector thread stopped before round {round_index}")
        self._cond.wait(timeout=1.0)
      ok, value = self._results.pop(round_index)
    if not ok:
      raise value
    return value

  def close(self) -> None:
    """Stops after the round being collected (a killed round resumes from its store on the next run)."""
    with self._cond:
      self._closed = True
      self._cond.notify_all()
    if self._thread is not None:
      self._thread.join()

  def _run(self) -> None:
    for i in range(self.rounds):
      if self.done(i):
        continue
      with self._cond:
        while not self._ready(i) and not self._closed:
          self._cond.wait()
        if self._closed:
          return
        actor = self._actors[self.version(i)]
      try:
        outcome = (True, self.collect(i, actor))
      except BaseException as e:  # pylint: disable=broad-except  # re-raised in the learner's thread
        outcome = (False, e)
      with self._cond:
        self._results[i] = outcome
        self._cond.notify_all()
      if not outcome[0]:
        return
