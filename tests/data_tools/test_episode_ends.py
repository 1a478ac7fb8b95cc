"""episode_ends: each evaluated episode counted once as a success, a negative reward, out of time (MiniWoB++'s page
clock), out of steps or other."""

import pytest

from data_tools import episode_ends
from jaxagent import types
from jaxagent.data.store import TrajectoryStore


def _traj(i, rewards, status="completed", success=0.0, reason=None):
  task = types.Task(id=f"t{i}", intent="x", site="miniwob", start_url="")
  steps = [types.Step(step=k, reward=r, info={"reason": reason}) for k, r in enumerate(rewards)]
  return types.Trajectory(task, steps, status=status, success=success)


def test_ends_are_counted_per_seed_and_policy(tmp_path, capsys):
  for seed, policy, trajs in ((0, "il", [_traj(0, [0.0, 1.0], success=1.0), _traj(1, [0.0, -1.0])]),
                              (0, "grpo", [_traj(0, [0.0, 0.0], "truncated"), _traj(1, [0.1])]),
                              (1, "il", [_traj(0, [-1.0]), _traj(1, [0.0], "truncated"),
                                         _traj(2, [0.0, -1.0], reason="timed out")])):
    store = TrajectoryStore(str(tmp_path / f"seed{seed}" / "eval" / policy))
    for t in trajs:
      store.append(t)
  table = episode_ends.main([str(tmp_path)])
  assert table[0]["il"] == {"success": 1, "negative": 1, "out_of_time": 0, "out_of_steps": 0, "other": 0}
  assert table[0]["grpo"] == {"success": 0, "negative": 0, "out_of_time": 0, "out_of_steps": 1, "other": 1}
  # the page's clock ending an episode (−1, "timed out") is not a wrong answer
  assert table[1] == {"il": {"success": 0, "negative": 1, "out_of_time": 1, "out_of_steps": 1, "other": 0}}
  assert "out_of_steps" in capsys.readouterr().out
  with pytest.raises(FileNotFoundError, match="grpo"):
    episode_ends.ends(str(tmp_path), ["grpo"])  # seed 1 has no grpo store
