import pickle

import pytest

from jaxagent.types import Action, ActionKind, Task, Trajectory, Step


def test_task_json_round_trip():
  task = Task(id="shop-1", intent="Buy a lamp", site="shop", start_url="http://127.0.0.1:1/", allowed_origins=("a",))
  assert Task.from_json(task.to_json()) == task


def test_task_unknown_field_is_named():
  with pytest.raises(ValueError, match="intnet"):
    Task.from_json({"id": "x", "intnet": "typo", "site": "shop", "start_url": "/"})


def test_action_json_and_pickle():
  a = Action(ActionKind.TYPE, element=3, text="lamp", enter=True)
  assert Action.from_json(a.to_json()) == a
  assert pickle.loads(pickle.dumps(a)) == a
  assert Action(ActionKind.ANSWER, text="x").ends_episode and not a.ends_episode


def test_trajectory_reward_sums_steps():
  t = Trajectory(Task(id="t", intent="i", site="s", start_url="/"), steps=[Step(0, reward=0.0), Step(1, reward=1.0)])
  assert t.trajectory_reward == 1.0
