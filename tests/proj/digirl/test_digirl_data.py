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


def _config(capacity: int = 2000):
  return ml_collections.ConfigDict({"features": {"text_dim": 8}, "gamma": 0.5, "capacity": capacity,
                                    "actor": {"quantile": 0.5, "advantage": "code"}, "tasks": {"max_steps": 10},
                                    "parse": "lenient"})


def _data(*trajs) -> data_lib.Data:
  """Trajectory i's screen k has image features [i, k]."""
  data = data_lib.Data()
  data.add(store=None, trajs=trajs, screens=[np.asarray([[i, k] for k in range(len(t.steps) + 1)], np.float32)
                                             for i, t in enumerate(trajs)])
  return data


def test_data_keeps_the_judged_trajectories_that_took_a_step():
  data = _data(_traj("a", 2, 1.0), _traj("unjudged", 2, None), _traj("empty", 0, 0.0), _traj("b", 1, 0.0))
  assert [t.task.id for t in data.trajs] == ["a", "b"]
  assert len(data.stores) == len(data.screens) == 2


def test_the_replay_is_the_newest_steps_in_the_order_they_came():
  data = _data(_traj("a", 3, 1.0), _traj("b", 2, 0.0), _traj("c", 2, 1.0))
  replay = data.step_arrays(_config(), last=3)
  np.testing.assert_array_equal(replay["index"], [[1, 1], [2, 0], [2, 1]])
  assert all(len(v) == 3 for v in replay.values())
  np.testing.assert_array_equal(replay["image"][0], [1, 0, 1, 1])  # the cut trajectory keeps [f_0 ‖ f_1]
  assert len(data.step_arrays(_config())["index"]) == len(data.step_arrays(_config(), last=100)["index"]) == 7


def test_filtered_bc_picks_every_step_of_the_kept_trajectories_that_has_a_screen():
  data = _data(_traj("a", 2, 1.0), _traj("b", 2, 0.0), _traj("c", 1, 1.0, images=False))
  keep = training.online_keep(_config(), data, traj_critic=None)
  np.testing.assert_array_equal(keep, [True, False, True])
  picks, info = training.actor_picks(_config(), data, "filtered_bc", keep)
  assert picks == [(0, 0, "act 0", 1.0), (0, 1, "act 1", 1.0)]
  assert info == {"kept_trajectories": 2, "kept_success": 1.0, "buffer_steps": 3, "samples": 2}


def test_the_actor_trains_on_the_newest_capacity_steps_of_the_kept_trajectories_in_order():
  """The code refills a FIFO of `capacity` transitions with the kept trajectories' steps (`filter_buffer`): past
  the capacity only the newest stay."""
  data = _data(_traj("a", 2, 1.0), _traj("b", 2, 0.0), _traj("c", 2, 1.0), _traj("d", 1, 1.0))
  keep = training.online_keep(_config(), data, traj_critic=None)  # a, c, d: 5 steps
  picks, info = training.actor_picks(_config(capacity=3), data, "filtered_bc", keep)
  assert [(i, k) for i, k, _, _ in picks] == [(2, 0), (2, 1), (3, 0)]
  assert info["buffer_steps"] == 3
  unbounded, _ = training.actor_picks(_config(capacity=0), data, "filtered_bc", keep)
  assert [(i, k) for i, k, _, _ in unbounded] == [(0, 0), (0, 1), (2, 0), (2, 1), (3, 0)]


def test_digirl_caps_the_buffer_before_its_advantage_filter(monkeypatch):
  """The code's hard filter weighs the samples drawn from the capped buffer, so a step the cap dropped is never
  trained on, and a step the filter drops does not let an older one in."""
  data = _data(_traj("a", 2, 1.0), _traj("b", 2, 0.0), _traj("c", 3, 1.0))
  keep = training.online_keep(_config(), data, traj_critic=None)  # a, c: buffer of 3 = c's steps
  v = np.zeros(7, np.float32)
  v[4] = 1.0  # c's first step: A = 0 − 1 − 0.05 + 0 + 0.25 < 0
  monkeypatch.setattr(training.critics, "step_values", lambda model, arrays: (v, np.zeros_like(v)))
  picks, info = training.actor_picks(_config(capacity=3), data, "digirl", keep, step_critic=object())
  assert [(i, k) for i, k, _, _ in picks] == [(2, 1), (2, 2)]
  assert info["buffer_steps"] == 3


def test_a_missing_screen_is_its_nearest_neighbours_the_later_on_a_tie():
  assert data_lib._nearest(["a", None, "c"], 1) == "c"
  assert data_lib._nearest(["a", None, None, None], 2) == "a"
  assert data_lib._nearest([None, None], 0) is None
