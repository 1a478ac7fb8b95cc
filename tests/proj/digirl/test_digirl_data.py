"""DigiRL's data and the actor's picks from it, on hand-made trajectories (no model, no browser)."""

import ml_collections
import numpy as np

from jaxagent import types
from jaxagent.proj.digirl import data as data_lib
from jaxagent.proj.digirl import training


def _traj(goal: str, n: int, success, images: bool = True) -> types.Trajectory:
  task = types.Task(id=goal, intent=goal, site="shop", start_url="http://localhost/")
  steps = [types.Step(step=k, obs_text=f"Goal: {goal} {k}", action_text=f"act {k}",
                      image_path=f"{goal}_{k}.png" if images else None) for k in range(n)]
  return types.Trajectory(task, steps, success=success)


def _config():
  return ml_collections.ConfigDict({"features": {"text_dim": 8}, "gamma": 0.5, "actor": {"quantile": 0.5}})


def _data(*trajs) -> data_lib.Data:
  data = data_lib.Data()
  data.add(store=None, trajs=trajs, screens=[np.zeros((len(t.steps) + 1, 2), np.float32) for t in trajs])
  return data


def test_data_keeps_the_judged_trajectories_that_took_a_step():
  data = _data(_traj("a", 2, 1.0), _traj("unjudged", 2, None), _traj("empty", 0, 0.0), _traj("b", 1, 0.0))
  assert [t.task.id for t in data.trajs] == ["a", "b"]
  assert len(data.stores) == len(data.screens) == 2


def test_the_replay_is_the_newest_trajectories_holding_the_last_steps():
  data = _data(_traj("a", 3, 1.0), _traj("b", 2, 0.0), _traj("c", 2, 1.0))
  np.testing.assert_array_equal(data.step_arrays(_config(), last=3)["index"], [[1, 0], [1, 1], [2, 0], [2, 1]])
  assert len(data.step_arrays(_config())["index"]) == 7


def test_filtered_bc_picks_every_step_of_the_kept_trajectories_that_has_a_screen():
  data = _data(_traj("a", 2, 1.0), _traj("b", 2, 0.0), _traj("c", 1, 1.0, images=False))
  keep = training.online_keep(_config(), data, traj_critic=None)
  np.testing.assert_array_equal(keep, [True, False, True])
  picks, info = training.actor_picks(_config(), data, "filtered_bc", keep)
  assert picks == [(0, 0, "act 0", 1.0), (0, 1, "act 1", 1.0)]
  assert info == {"kept_trajectories": 2, "kept_success": 1.0, "samples": 2}


def test_a_missing_screen_is_its_nearest_neighbours_the_later_on_a_tie():
  assert data_lib._nearest(["a", None, "c"], 1) == "c"
  assert data_lib._nearest(["a", None, None, None], 2) == "a"
  assert data_lib._nearest([None, None], 0) is None
