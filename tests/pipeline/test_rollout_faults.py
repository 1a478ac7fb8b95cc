"""Fault injections against resumable rollouts: an episode whose env process dies on every retry is stored
`errored`, reported apart from failures, and run again when the rollout resumes, up to the budget."""

import os
import pathlib

import ml_collections
import pytest

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import device, evaluate
from jaxagent.pipeline import rollout as rollout_lib
from jaxagent.pipeline.tasks import errored_count, success_rate


class DyingEnv:
  """Dies (the worker process exits) at reset while `task.meta["deaths"]`'s file has fewer lines than
  `task.meta["times"]`; otherwise a one-step episode whose reward says whether the action was "win"."""

  def reset(self, task):
    self.task = task
    deaths = task.meta.get("deaths")
    if deaths:
      path = pathlib.Path(deaths)
      if (path.read_text().count("\n") if path.exists() else 0) < task.meta["times"]:
        with path.open("a") as f:
          f.write("x\n")
        os._exit(3)
    return types.Observation(url=task.start_url, intent=task.intent)

  def step(self, action):
    return types.Observation(url=self.task.start_url, intent=self.task.intent), float(action.text == "win"), True, {}

  def close(self):
    pass


class Win:
  def act(self, observations, histories):
    return ["win"] * len(observations)


class Judge:
  def evaluate(self, task, traj):
    return types.Verdict(float(sum(s.reward for s in traj.steps) > 0), "reward")


def _env(retries):
  return ml_collections.ConfigDict(dict(workers=1, step_timeout=20.0, reset_timeout=20.0, errored_retries=retries))


def _run(tasks, store, retries=2):
  spec = {"kind": f"{DyingEnv.__module__}:DyingEnv"}
  return rollout_lib.rollout(spec, _env(retries), Win(), tasks, store, judge=Judge(), name="win",
                             parse=lambda text: types.Action(types.ActionKind.TYPE, text=text))


def _task(i, **meta):
  return types.Task(id=f"t{i}", intent="win", site="fake", start_url=f"fake://{i}", max_steps=1, meta=meta)


@pytest.mark.slow
def test_errored_episodes_run_again_on_resume_up_to_the_budget(tmp_path):
  # t0's worker dies on its first 3 attempts (the pool's 1 + 2 retries): errored; it would succeed on a 4th.
  tasks = [_task(0, deaths=str(tmp_path / "d0"), times=3), _task(1)]
  store = TrajectoryStore(tmp_path / "store")
  first = _run(tasks, store)
  assert [t.status for t in first] == ["errored", "completed"]
  assert success_rate(first) == 1.0 and errored_count(first) == 1  # errored is not a failure
  summary = evaluate.summary(first, 1.0)
  assert summary["episodes"] == 1 and summary["errored"] == 1 and summary["success_rate"] == 1.0

  resumed = _run(tasks, store)  # the resume runs t0 again (not t1), and now it succeeds
  assert [(t.status, t.success) for t in resumed] == [("completed", 1.0), ("completed", 1.0)]
  assert len(store) == 3  # the errored record stays; readers take the newest record of each id
  assert [(t.task.id, t.status) for t in rollout_lib.episodes(store)] == [("t0", "completed"), ("t1", "completed")]
  assert [t.task.id for t in rollout_lib.episodes(TrajectoryStore(store.path), errored=True)] == ["t0", "t1"]


@pytest.mark.slow
def test_an_episode_that_keeps_crashing_stops_after_the_budget(tmp_path):
  tasks = [_task(0, deaths=str(tmp_path / "d0"), times=10 ** 6)]
  store = TrajectoryStore(tmp_path / "store")
  for _ in range(4):  # the first run and 2 retried resumes run it; the 4th call has no budget left
    out = _run(tasks, store, retries=2)
  assert [t.status for t in out] == ["errored"]
  assert len(store) == 3 and rollout_lib.episodes(store) == []
  assert (tmp_path / "d0").read_text().count("\n") == 9  # 3 runs × 3 attempts each
