"""The multi-process layer of the recipes without JAX processes: the shard assignment, and rollouts run as
process k of n (`Rollouts.run(process=(k, n))`) into shards whose union readers see as one store, in task order,
exactly as a single process's store."""

import os

import ml_collections
import numpy as np
import pytest

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import distributed
from jaxagent.pipeline import rollout as rollout_lib


class ScreenEnv:
  """A one-step episode with a screenshot whose colour is the task's number; the reward says whether the action
  was "win"."""

  def reset(self, task):
    self.task = task
    return self._obs()

  def _obs(self):
    shot = np.full((8, 8, 3), int(self.task.meta["n"]), np.uint8)
    return types.Observation(url=self.task.start_url, intent=self.task.intent, screenshot=shot)

  def step(self, action):
    return self._obs(), float(action.text == "win"), True, {}

  def close(self):
    pass


class WinOddTasks:
  """Wins the tasks whose number is odd: the outcome is the task's, whichever process runs it."""

  def act(self, observations, histories):
    del histories
    return ["win" if int(o.url.rsplit("/", 1)[1]) % 2 else "lose" for o in observations]


class Judge:
  def evaluate(self, task, traj):
    del task
    return types.Verdict(float(sum(s.reward for s in traj.steps) > 0), "reward")


ENV = ml_collections.ConfigDict(dict(workers=2, step_timeout=20.0, reset_timeout=20.0, errored_retries=0))
SPEC = {"kind": f"{ScreenEnv.__module__}:ScreenEnv"}


def _tasks(n):
  return [types.Task(id=f"t{i}", intent="win", site="fake", start_url=f"fake://{i}", max_steps=1, meta={"n": i})
          for i in range(n)]


def _run(tasks, store, process=None):
  return rollout_lib.rollout(SPEC, ENV, WinOddTasks(), tasks, store, judge=Judge(), name="odd", process=process,
                             parse=lambda text: types.Action(types.ActionKind.TYPE, text=text))


def _outcomes(trajs):
  return [(t.task.id, t.success, t.status, len(t.steps)) for t in trajs]


@pytest.mark.parametrize("n,count", [(7, 2), (8, 4), (3, 5)])
def test_every_task_goes_to_one_process_by_its_index(n, count):
  tasks = list(range(n))
  shares = [distributed.shard(tasks, k, count) for k in range(count)]
  assert sorted(x for share in shares for x in share) == tasks
  assert all(x % count == k for k, share in enumerate(shares) for x in share)
  assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_process_index_outside_the_job_is_refused():
  with pytest.raises(ValueError, match="process index 2 is outside 0..1"):
    distributed.shard([1, 2, 3], 2, 2)


@pytest.mark.slow
def test_sharded_rollouts_read_back_as_one_process_store(tmp_path):
  tasks = _tasks(7)
  single = _run(tasks, str(tmp_path / "single"))
  sharded = str(tmp_path / "sharded")
  for k in (1, 0):  # the processes finish in any order; process 1 here before process 0
    _run(tasks, sharded, process=(k, 2))
  assert rollout_lib.shards(sharded) == ["shard0", "shard1"]
  assert not os.path.exists(os.path.join(sharded, "episodes.jsonl"))  # no process wrote the common log
  for k, ids in ((0, ["t0", "t2", "t4", "t6"]), (1, ["t1", "t3", "t5"])):
    shard = TrajectoryStore(rollout_lib.shard_dir(sharded, k))
    assert sorted(shard.read_json(i)["task"]["id"] for i in range(len(shard))) == ids

  store = TrajectoryStore(sharded)
  union = rollout_lib.episodes(store)
  assert _outcomes(union) == _outcomes(single) == _outcomes(rollout_lib.episodes(TrajectoryStore(
      str(tmp_path / "single"))))
  assert [t.task.id for t in union] == [t.id for t in tasks]  # task order, not the shards' order
  assert [t.success for t in union] == [float(i % 2) for i in range(7)]
  assert rollout_lib.stored_ids(store) == {t.id for t in tasks}
  for traj in union:  # every screenshot loads through the store above the shards
    assert np.all(store.load_image(traj.steps[0].image_path) == traj.task.meta["n"])
  # A rerun (a resumed job) finds every episode in the union and runs none again.
  again = _run(tasks, sharded, process=(0, 2))
  assert _outcomes(again) == _outcomes(union)
  assert sum(len(TrajectoryStore(rollout_lib.shard_dir(sharded, k))) for k in (0, 1)) == len(tasks)


@pytest.mark.slow
def test_a_job_resumed_with_another_process_count_runs_only_the_missing_tasks(tmp_path):
  tasks, path = _tasks(6), str(tmp_path / "store")
  _run(tasks[:4], path)  # a single-process run stopped after 4 episodes
  _run(tasks, path, process=(1, 2))
  _run(tasks, path, process=(0, 2))
  store = TrajectoryStore(path)
  assert len(store) == 4
  assert [TrajectoryStore(rollout_lib.shard_dir(path, k)).read_json(0)["task"]["id"] for k in (0, 1)] == ["t4", "t5"]
  assert [t.task.id for t in rollout_lib.episodes(store)] == [t.id for t in tasks]


def test_union_keeps_the_last_record_of_an_id_and_lists_unordered_ids_last(tmp_path):
  path = str(tmp_path / "store")
  first, second = (TrajectoryStore(rollout_lib.shard_dir(path, k)) for k in (0, 1))
  task = lambda i: types.Task(id=f"t{i}", intent="x", site="fake", start_url="fake://", max_steps=1)
  first.append(types.Trajectory(task=task(1), status="errored"))
  first.append(types.Trajectory(task=task(9), success=1.0))  # in no rollout's task list
  second.append(types.Trajectory(task=task(0), success=0.0))
  second.append(types.Trajectory(task=task(1), success=1.0))  # t1's retry, stored by the other process
  store = TrajectoryStore(path)
  assert rollout_lib.errored_counts(store) == {}
  rollout_lib.record_order(path, ["t0", "t1"])
  rollout_lib.record_order(path, ["t1", "t2"])  # a later rollout adds only the ids not listed yet
  assert rollout_lib.read_order(path) == ["t0", "t1", "t2"]
  assert [(t.task.id, t.success) for t in rollout_lib.episodes(store)] == [("t0", 0.0), ("t1", 1.0), ("t9", 1.0)]


def test_task_order_sorts_listed_ids_first_and_keeps_the_rest_as_they_came():
  assert rollout_lib.task_order(["c", "x", "a", "b", "w"], ["a", "b", "c"]) == ["a", "b", "c", "x", "w"]
  assert rollout_lib.task_order(["b", "a"], []) == ["b", "a"]


def test_with_one_process_the_collectives_are_no_ops():
  assert distributed.process_count() == 1 and distributed.is_main()
  distributed.barrier("alone")
  assert distributed.agree(True) and not distributed.agree(False)
