"""WebRL's replay buffer filter (`proj/webrl/replay.py`)."""

import numpy as np
import pytest

from jaxagent import types
from jaxagent.proj.webrl import replay
from jaxagent.rl import losses


def test_first_per_task_with_one_chunk_keeps_the_first_success_of_each_task():
  tasks = ["a", "b", "a", "c", "b", "d", "c"]
  success = [False, True, True, True, True, False, True]
  assert replay.first_per_task(tasks, success, chunks=1) == [1, 2, 3]
  assert replay.first_per_task([], [], chunks=1) == []
  assert replay.first_per_task(["a", "a"], [False, False], chunks=1) == []


def _process_data_chunks(trajs, num_processes=8):
  """THUDM/WebRL scripts/process_data.py: `replay_data`'s `file_contents[i::num_processes]` and each
  `process_data_chunk`'s `success_tasks` dedup, transcribed; the kept trajectories in the order it gathers them."""
  kept = []
  for chunk in [trajs[i::num_processes] for i in range(num_processes)]:
    success_tasks = {}
    for traj in chunk:
      if traj["trajectory_reward"] >= 0.5:
        if traj["task"] in success_tasks:
          continue
        kept.append(traj["id"])
        success_tasks[traj["task"]] = True
  return kept


def test_first_per_task_keeps_the_first_success_of_each_task_in_each_of_the_originals_8_chunks():
  assert replay.CHUNKS == 8
  assert replay.first_per_task(["a"] * 10, [True] * 10) == list(range(8))  # 8 and 9 share chunks 0 and 1
  assert replay.first_per_task(["a", "b", "a", "a"], [False, True, True, True], chunks=2) == [2, 1, 3]
  rng = np.random.default_rng(0)
  tasks = [str(t) for t in rng.integers(0, 5, 60)]
  success = (rng.random(60) < 0.6).tolist()
  trajs = [{"id": i, "task": t, "trajectory_reward": float(ok)} for i, (t, ok) in enumerate(zip(tasks, success))]
  kept = replay.first_per_task(tasks, success)
  assert kept == _process_data_chunks(trajs)
  one_each = replay.first_per_task(tasks, success, chunks=1)
  assert len(one_each) == len({t for t, ok in zip(tasks, success) if ok}) < len(kept)
  with pytest.raises(ValueError, match=r"config\.replay\.chunks=0"):
    replay.first_per_task(tasks, success, chunks=0)


def _demo(k):
  task = types.Task(id=f"d{k}", intent="Open apparel", site="shop", start_url="u")
  return types.Trajectory(task, [types.Step(step=0, obs_text=f"prompt {k}", action_text="exit()")], success=1.0)


@pytest.mark.parametrize("chunks,kept", [(8, 8), (1, 1), (3, 3)])
def test_history_keeps_a_tasks_successes_per_chunk_of_the_config(monkeypatch, chunks, kept):
  from configs import webrl as webrl_config  # pylint: disable=g-import-not-at-top
  config = webrl_config.get_config()
  config.replay.chunks = chunks
  monkeypatch.setattr(replay.data, "demos", lambda workdir: [_demo(k) for k in range(10)])
  rows = replay.history(config, "unused", 1)
  assert rows["state"] == [f"prompt {k}" for k in range(kept)]


def test_rank_scores_match_webrl_rank_score_of_the_per_token_form():
  logp_tok = np.array([[-0.1, -0.2, -0.3, 0.0], [-1.0, 0.0, 0.0, 0.0], [-0.05, -0.5, 0.0, 0.0], [0.0] * 4])
  mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]], np.float32)
  ref = np.asarray(losses.webrl_rank_score(logp_tok, mask))
  got = replay.rank_scores((logp_tok * mask).sum(-1), mask.sum(-1).astype(np.int32))
  np.testing.assert_allclose(got, ref, rtol=1e-6)
  np.testing.assert_allclose(got, [np.exp(-0.2), np.exp(-1.0), np.exp(-0.275), 1.0], rtol=1e-6)
  assert got.dtype == np.float32


SCORES = np.array([0.5, 0.95, 0.951, 0.6, 0.49, 0.7, 1.0, 0.50001, 0.0])
IN_BAND = [1, 3, 5, 7]  # (0.5, 0.95]: 0.5 out, 0.95 in


def test_select_keeps_the_scores_in_the_half_open_band():
  for scores in (SCORES, SCORES.astype(np.float32)):
    kept = replay.select(scores, current_steps=100, seed=0)
    assert kept.dtype == np.int64
    assert sorted(kept.tolist()) == IN_BAND


def test_select_caps_at_twice_the_current_steps():
  kept = replay.select(SCORES, current_steps=1, seed=0)
  assert len(kept) == 2 and set(kept.tolist()) <= set(IN_BAND)
  assert len(replay.select(SCORES, current_steps=1, seed=0, cap=3)) == 3
  assert len(replay.select(SCORES, current_steps=0, seed=0)) == 0
  assert len(replay.select(np.zeros(0), current_steps=5, seed=0)) == 0


def test_select_is_a_seeded_shuffle():
  scores = np.full(50, 0.8)
  a, b, c = (replay.select(scores, 10, seed=s) for s in (4, 4, 5))
  np.testing.assert_array_equal(a, b)
  assert len(a) == 20 and len(set(a.tolist())) == 20
  assert not np.array_equal(a, c)
  assert not np.array_equal(a, np.arange(20))  # shuffled, not the first ones in order
