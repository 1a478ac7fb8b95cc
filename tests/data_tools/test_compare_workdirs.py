"""`data_tools/compare_workdirs.py`: two runs' stores and training logs, compared screen by screen and loss by loss."""

import json

import numpy as np

from data_tools import compare_workdirs
from jaxagent import types
from jaxagent.data.store import TrajectoryStore


def _traj(i, action="tap", shot=0):
  task = types.Task(id=f"t{i}", intent="x", site="s", start_url="http://x/")
  pixels = np.full((8, 6, 3), shot, np.uint8)
  observation = types.Observation(url="u", screenshot=pixels)
  steps = [types.Step(step=0, obs_text="p", action_text=action, observation=observation)]
  return types.Trajectory(task, steps, success=1.0)


def _workdir(root, trajs, loss_values):
  store = TrajectoryStore(str(root / "behaviour" / "store"))
  for t in trajs:
    store.append(t)
  (root / "il").mkdir(parents=True)
  (root / "il" / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": v}) + "\n"
                                                     for s, v in enumerate(loss_values, 1)))


def test_finds_the_store_whose_screens_or_actions_differ_and_the_training_whose_losses_do(tmp_path, capsys):
  _workdir(tmp_path / "a", [_traj(0), _traj(1), _traj(2)], [2.0, 1.0])
  _workdir(tmp_path / "b", [_traj(0), _traj(1, shot=9), _traj(2, action="swipe")], [2.0, 1.0])
  out = compare_workdirs.main([str(tmp_path / "a"), str(tmp_path / "b")])
  assert out["stores"]["behaviour/store"] == {"episodes": [3, 3], "actions_differ": 1, "screens": 3,
                                              "screens_differ": 1}
  assert out["trainings"] == {"il": True}
  printed = capsys.readouterr().out
  assert "DIFFERS  behaviour/store: 3/3 episodes, actions differ in 1, screens differ 1/3" in printed
  assert "same     il: losses" in printed
  _workdir(tmp_path / "c", [_traj(0), _traj(1), _traj(2)], [2.0, 1.5])
  out = compare_workdirs.main([str(tmp_path / "a"), str(tmp_path / "c")])
  assert out["stores"]["behaviour/store"]["screens_differ"] == 0 and out["trainings"] == {"il": False}
