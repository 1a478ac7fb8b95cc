"""WebRL's training rows (`proj/webrl/data.py`)."""

import numpy as np

from jaxagent import types
from jaxagent.proj.webrl import data


def _add_mc_return(rewards, gamma):
  """THUDM/WebRL scripts/process_data.py:add_mc_return, transcribed."""
  trajectory_rewards = np.asarray(rewards, np.float64).reshape(1, -1)
  gamma_row = np.cumprod(np.ones((1, trajectory_rewards.shape[1])) * gamma)
  gamma_matrix = np.triu(gamma_row.reshape(1, -1) / gamma_row.reshape(-1, 1))
  return np.sum(trajectory_rewards * gamma_matrix, axis=1)


def test_mc_returns_match_add_mc_return():
  for n in range(1, 8):
    for reward in (0.0, 1.0, 0.5, -1.0):
      for gamma in (0.9, 0.5, 1.0 - 1e-6):
        np.testing.assert_allclose(data.mc_returns(n, reward, gamma), _add_mc_return([reward] * n, gamma),
                                   rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(data.mc_returns(3, 1.0), [2.71, 1.9, 1.0], rtol=1e-6)  # γ = 0.9 by default
  assert data.mc_returns(0, 1.0).shape == (0,)


def _traj(tid, n, status="completed"):
  task = types.Task(id=tid, intent=f"intent {tid}", site="shop", start_url="u")
  return types.Trajectory(task, [types.Step(step=k, obs_text=f"{tid} s{k}", action_text=f"{tid} a{k}")
                                 for k in range(n)], status=status)


def test_step_rows_link_states_and_repeat_the_reward():
  rows = data.step_rows([_traj("x", 3), _traj("y", 1)], [1.0, 0.0])
  assert rows["state"] == ["x s0", "x s1", "x s2", "y s0"]
  assert rows["next_state"] == ["x s1", "x s2", "x s2", "y s0"]  # a last step's next state is its own
  assert rows["action"] == ["x a0", "x a1", "x a2", "y a0"]
  assert rows["task"] == ["intent x"] * 3 + ["intent y"]
  np.testing.assert_array_equal(rows["reward"], [1.0, 1.0, 1.0, 0.0])
  np.testing.assert_allclose(rows["mc_return"], [2.71, 1.9, 1.0, 0.0], rtol=1e-6)
  np.testing.assert_array_equal(rows["index"], [[0, 0], [0, 1], [0, 2], [1, 0]])
  assert rows["index"].dtype == np.int32 and rows["reward"].dtype == np.float32


def test_step_rows_of_nothing_are_empty():
  rows = data.step_rows([], [])
  assert rows["state"] == [] and rows["index"].shape == (0, 2) and rows["mc_return"].shape == (0,)


def test_usable_needs_a_run_with_prompts_and_replies():
  assert data.usable(_traj("a", 2))
  assert not data.usable(_traj("a", 2, status="errored"))
  assert not data.usable(_traj("a", 0))
  t = _traj("a", 2)
  t.steps[1].action_text = ""
  assert not data.usable(t)


def test_sample_is_one_human_and_one_gpt_turn():
  s = data.sample("i", "prompt", "reply", weight=0.5)
  assert s == {"id": "i", "images": [], "conversations": [{"from": "human", "value": "prompt"},
                                                          {"from": "gpt", "value": "reply"}], "weight": 0.5}


def test_cut_html_cuts_only_the_current_rounds_page():
  from jaxagent.agents.webrl import webrl_prompt
  html = '<html> <a id="5"> Apparel </a> <a id="6"> Audio </a> </html>'
  prompt = webrl_prompt("Open the audio category", ['do(action="Click", element="29")'], html)
  cut = data.cut_html(prompt, 12)
  assert cut == prompt.replace(html, '<html> <a id')
  assert cut.startswith("Task Instruction: Open the audio category\n\nRound 0")  # the instruction and history kept
  assert 'do(action="Click", element="29")' in cut
  assert data.cut_html(prompt, 1000) == prompt
  assert data.cut_html("no rounds here", 3) == "no rounds here"


def test_the_actor_trains_at_most_actor_epochs_passes_over_its_samples():
  from configs import webrl as webrl_config  # pylint: disable=g-import-not-at-top
  config = webrl_config.get_config()
  config.actor.train.update(steps=100, batch_size=4)
  config.actor.epochs = 2.0
  assert data.actor_steps(config, 191) == 96  # ceil(2 × 191 / 4)
  assert data.actor_steps(config, 12) == 6
  assert data.actor_steps(config, 400) == 100  # the configured steps when they are fewer
  assert data.actor_steps(config, 0) == 1
