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


def test_task_files_with_bad_fields_are_refused_naming_the_task_and_field(tmp_path):
  import json

  from jaxagent.pipeline.tasks import read_tasks
  good = {"id": "t1", "intent": "x", "site": "shop", "start_url": "http://127.0.0.1:8000/"}
  for bad, message in [({"allowed_origins": "http://127.0.0.1:8000"}, "allowed_origins must be a list"),
                       ({"allowed_origins": [8000]}, "allowed_origins must be a list"),
                       ({"max_steps": "15"}, "max_steps must be an integer"),
                       ({"evaluator": "url_match"}, "evaluator must be an object"),
                       ({"intent": None}, "intent must be a string")]:
    with pytest.raises(ValueError, match=f"Task 't1': {message}"):
      Task.from_json({**good, **bad})
  with pytest.raises(ValueError, match=r"missing field\(s\) \['start_url'\]"):
    Task.from_json({k: v for k, v in good.items() if k != "start_url"})
  path = tmp_path / "tasks.jsonl"
  path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "t2", "allowed_origins": "http://x"}) + "\n")
  with pytest.raises(ValueError, match=rf"{path}:2: Task 't2': allowed_origins must be a list"):
    read_tasks(str(path))
