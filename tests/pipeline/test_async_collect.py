"""pipeline.async_collect: the lag schedule, overlap of collection with training, resume and errors."""

import threading
import time

import pytest

from jaxagent.pipeline import async_collect
from jaxagent.pipeline.async_collect import AsyncCollector, behaviour_version


def test_behaviour_version_is_the_newest_actor_within_the_lag():
  assert [behaviour_version(i, 0) for i in range(4)] == [0, 1, 2, 3]
  assert [behaviour_version(i, 1) for i in range(4)] == [0, 0, 1, 2]
  assert [behaviour_version(i, 2) for i in range(5)] == [0, 0, 0, 1, 2]
  with pytest.raises(ValueError, match="max_lag=-1"):
    behaviour_version(0, -1)


def _learn(max_lag: int, rounds: int, train_s: float = 0.0, done=lambda i: False):
  """A learner loop over `AsyncCollector`: actor k is the string 'a<k>'; returns (results, event log)."""
  log, lock = [], threading.Lock()

  def note(event):
    with lock:
      log.append(event)

  def collect(i, actor):
    note(("collect", i, actor))
    time.sleep(0.05)
    return {"round": i, "actor": actor}

  results = {}
  with AsyncCollector(collect, rounds, max_lag, done=done) as collector:
    collector.publish(0, "a0")
    for i in range(rounds):
      if not done(i):  # a resumed run: round i and its training finished in an earlier run
        results[i] = collector.result(i)
      note(("train", i))
      time.sleep(train_s)
      collector.publish(i + 1, f"a{i + 1}")
  return results, log


def test_synchronous_when_max_lag_is_zero():
  results, log = _learn(0, 3)
  assert [results[i]["actor"] for i in range(3)] == ["a0", "a1", "a2"]
  assert log == [("collect", 0, "a0"), ("train", 0), ("collect", 1, "a1"), ("train", 1), ("collect", 2, "a2"),
                 ("train", 2)]


def test_lag_one_collects_the_next_round_while_training():
  results, log = _learn(1, 4, train_s=0.3)
  assert [results[i]["actor"] for i in range(4)] == ["a0", "a0", "a1", "a2"]
  # round 1 is collected (with a0) before round 0's training has finished publishing a1
  assert log.index(("collect", 1, "a0")) < log.index(("collect", 2, "a1"))
  assert log.index(("collect", 1, "a0")) < log.index(("train", 1))
  assert log.index(("collect", 2, "a1")) < log.index(("train", 2))


def test_overlap_shortens_the_wall_time():
  t0 = time.monotonic()
  _learn(0, 4, train_s=0.2)
  sync = time.monotonic() - t0
  t0 = time.monotonic()
  _learn(1, 4, train_s=0.2)
  overlapped = time.monotonic() - t0
  assert overlapped < sync - 0.1  # 4 x (0.05 + 0.2) vs 0.05 + 4 x 0.2: collections hide behind training


def test_finished_rounds_are_not_collected_again():
  results, log = _learn(1, 3, done=lambda i: i == 0)
  assert [e for e in log if e[0] == "collect"] == [("collect", 1, "a0"), ("collect", 2, "a1")]
  assert log.index(("collect", 2, "a1")) > log.index(("train", 0))
  assert sorted(results) == [1, 2]


def test_a_collection_error_is_raised_in_the_learner():
  def collect(i, actor):
    del actor
    if i == 1:
      raise RuntimeError("browser gone")
    return i

  with AsyncCollector(collect, 3, 1) as collector:
    collector.publish(0, "a0")
    assert collector.result(0) == 0
    with pytest.raises(RuntimeError, match="browser gone"):
      collector.result(1)


def test_close_stops_a_collector_waiting_for_an_actor():
  collector = AsyncCollector(lambda i, a: i, 4, 1)
  collector.publish(0, "a0")
  assert collector.result(0) == 0 and collector.result(1) == 1
  collector.close()  # round 2 waits for a1, which never comes: close must not hang
  assert not collector._thread.is_alive()  # pylint: disable=protected-access


def test_no_thread_without_lag():
  seen = []
  with AsyncCollector(lambda i, a: seen.append((i, a, threading.current_thread().name)), 2, 0) as collector:
    assert collector._thread is None  # pylint: disable=protected-access
    collector.publish(0, "a0")
    collector.result(0)
    with pytest.raises(RuntimeError, match="needs actor 1"):
      collector.result(1)
  assert seen == [(0, "a0", threading.current_thread().name)]
  assert async_collect.behaviour_version(1, 0) == 1


def test_a_gated_round_waits_for_allow_as_well_as_its_actor():
  order, lock = [], threading.Lock()

  def collect(i, actor):
    with lock:
      order.append(("collect", i, actor))
    return i

  with AsyncCollector(collect, 2, 1, gated=True) as collector:
    collector.publish(0, "a0")
    time.sleep(0.2)
    assert not order  # round 0 has its actor but not its allow
    collector.allow(0)
    assert collector.result(0) == 0
    time.sleep(0.2)
    assert order == [("collect", 0, "a0")]  # round 1's actor (a0) exists; still gated
    with lock:
      order.append(("allow", 1))
    collector.allow(1)
    assert collector.result(1) == 1
  assert order == [("collect", 0, "a0"), ("allow", 1), ("collect", 1, "a0")]
