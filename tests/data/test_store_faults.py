"""Fault injections against the trajectory store: real files truncated and damaged on disk."""

import glob
import os

import pytest

from jaxagent import types
from jaxagent.data import store as store_lib


def _traj(i):
  task = types.Task(id=f"task-{i}", intent="x", site="fixture", start_url="http://x/")
  steps = [types.Step(step=0, obs_text="o", action_text="a", action=types.Action(types.ActionKind.NOOP))]
  return types.Trajectory(task, steps, success=1.0)


def _store(tmp_path, n=3):
  store = store_lib.TrajectoryStore(tmp_path)
  for i in range(n):
    store.append(_traj(i))
  return store, os.path.join(tmp_path, "episodes.jsonl")


def test_a_log_that_lost_its_last_newline_keeps_every_committed_episode(tmp_path):
  _, log = _store(tmp_path)
  os.truncate(log, os.path.getsize(log) - 1)  # e.g. a copy that dropped the final byte
  store = store_lib.TrajectoryStore(tmp_path)
  assert [t.task.id for t in store] == ["task-0", "task-1", "task-2"]
  store.append(_traj(3))  # before: this append cut task-2 off for good
  assert [t.task.id for t in store_lib.TrajectoryStore(tmp_path)] == ["task-0", "task-1", "task-2", "task-3"]


def test_a_torn_last_line_is_moved_aside_byte_for_byte_and_appends_go_on(tmp_path):
  _, log = _store(tmp_path)
  size = os.path.getsize(log)
  with open(log, "ab") as f:
    f.write(b'{"id":"half-written","task":{"id":"task-9"')  # a writer killed mid-line
  store_lib.TrajectoryStore(tmp_path).append(_traj(3))
  assert [t.task.id for t in store_lib.TrajectoryStore(tmp_path)] == ["task-0", "task-1", "task-2", "task-3"]
  (sidecar,) = glob.glob(log + ".torn-*")
  with open(sidecar, "rb") as f:
    assert f.read() == b'{"id":"half-written","task":{"id":"task-9"'
  assert os.path.getsize(log) > size


@pytest.mark.parametrize("damage", [b'{"id":"ep-x","task":{"id":"t" BROKEN\n', b'["not", "a", "record"]\n',
                                    b'{"id":"ep-y","steps":[]}\n'])
def test_a_bad_record_is_an_error_naming_file_line_and_episode(tmp_path, damage):
  _, log = _store(tmp_path, n=2)
  with open(log, "ab") as f:
    f.write(damage)
  store_lib.TrajectoryStore(tmp_path).append(_traj(3))
  store = store_lib.TrajectoryStore(tmp_path)
  assert len(store) == 4
  with pytest.raises(store_lib.StoreError) as e:
    list(store)
  assert f"{log}:3 " in str(e.value)
  if b'"id":"ep-' in damage:
    assert damage.split(b'"')[3].decode() in str(e.value)
  assert store.read(3).task.id == "task-3"  # the records after it still read
