"""WebRL's training rows (`proj/webrl/data.py`)."""

import numpy as np

from jaxagent import types
from jaxagent.agents import webrl
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
  x, y = _traj("x", 3), _traj("y", 1)
  rows = data.step_rows([x, y], [1.0, 0.0])
  assert rows["state"] == ["x s0", "x s1", "x s2", "y s0"]
  assert rows["next_state"] == ["x s1", "x s2", data.final_state(x), data.final_state(y)]
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


# ------------------------------------------------------------------- the last step's next state (`build_policy_data`)


def _format_history(contents, index):
  """THUDM/WebRL scripts/process_data.py:build_policy_data.format_history, transcribed."""
  history = ""
  if index == 0:
    return history
  for i in range(index - 1, -1, -1):
    history = (f"Round {i}\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n{contents[i]['prompt']}\n\n"
               f"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n{contents[i]['fixed_response']}\n\n"
               + history)
  return history


def _format_prompt(instruction, index, html_text, contents):
  """`build_policy_data.format_prompt`, transcribed."""
  history = _format_history(contents, index)
  if len(history) + len(html_text) > (16384 - 512):
    html_text = html_text[:(16384 - 512) - len(history)]
  current_turn = (f"Round {index}\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n{html_text}\n\n"
                  "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n")
  return f"Task Instruction: {instruction}\n\n{history}{current_turn}"


def _build_policy_data(trace):
  """`build_policy_data`'s steps of one trace (its `new_item`s through `template`): (observation, next)."""
  out = []
  for i, item in enumerate(trace):
    nxt = trace[i + 1] if i != len(trace) - 1 else trace[i]
    out.append((_format_prompt(item["target"], i, trace[i]["html"], trace[:i + 1]),
                _format_prompt(item["target"], i + 1, nxt["html"], trace[:i + 1] + [nxt])))
  return out


def _episode(intent, htmls, replies, compact=False, max_chars=webrl.MAX_PROMPT_CHARS, observed=True):
  """An episode as the collector stores it: each step's prompt built by the WebRL format over its observation."""
  fmt = webrl.WebRL(compact=compact, max_prompt_chars=max_chars)
  task = types.Task(id="t", intent=intent, site="shop", start_url="u")
  steps = []
  for k, (html, reply) in enumerate(zip(htmls, replies)):
    obs = types.Observation(html=html)
    steps.append(types.Step(step=k, obs_text=fmt.build_prompt(task, obs, steps), action_text=reply,
                            observation=obs if observed else None))
  return types.Trajectory(task, steps, success=0.0)


HTMLS = ['<html> <a id="5"> Apparel </a> </html>', '<html> <a id="9"> Sort </a> </html>',
         '<html> <p> 3 results </p> </html>']
REPLIES = ['# Element: Apparel\ndo(action="Click", element="5")', 'do(action="Click", element="9")',
           'exit(message="done")']


def test_next_states_are_build_policy_datas_and_the_last_is_a_new_round_over_the_same_page():
  trace = [{"target": "Open apparel", "html": h, "fixed_response": r, "prompt": "Open apparel" if i == 0 else
            "** Simplified html **"} for i, (h, r) in enumerate(zip(HTMLS, REPLIES))]
  rows = data.step_rows([_episode("Open apparel", HTMLS, REPLIES)], [0.0])
  original = _build_policy_data(trace)
  assert rows["state"] == [o for o, _ in original]
  assert rows["next_state"] == [n for _, n in original]
  last = rows["next_state"][-1]
  assert last != rows["state"][-1]  # V(s') − V(s) is no longer 0 by construction
  assert last == ("Task Instruction: Open apparel\n\n"
                  "Round 0\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\nOpen apparel\n\n"
                  "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n" + REPLIES[0] + "\n\n"
                  "Round 1\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n** Simplified html **\n\n"
                  "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n" + REPLIES[1] + "\n\n"
                  "Round 2\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n** Simplified html **\n\n"
                  "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n" + REPLIES[2] + "\n\n"
                  "Round 3\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n" + HTMLS[2] + "\n\n"
                  "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n")


def test_the_final_state_reads_the_stored_page_as_the_prompts_do():
  page = '<html> <a id="5" href="/c/apparel" data-bbox="1,2,3,4"> Apparel </a> ' + "x" * 400 + " </html>"
  traj = _episode("Open apparel", [page], [REPLIES[0]], compact=True, max_chars=300)
  history = ("Round 0\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\nOpen apparel\n\n"
             "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n" + REPLIES[0] + "\n\n")
  got = data.final_state(traj, compact=True, max_chars=300)
  # the whole stored page, compacted, cut to what the longer history leaves (not the step's own, shorter, cut)
  assert webrl.current_html(got) == webrl.compact_html(page)[:300 - len(history)]
  assert len(webrl.current_html(got)) < len(webrl.current_html(traj.steps[0].obs_text)) < len(page)
  assert len(history) == 182  # so the page keeps 300 − 182 = 118 characters: 31 of markup, then 87 x
  assert got.endswith('\n<html> <a id="5"> Apparel </a> ' + "x" * 87 + "\n\n"
                      "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n")
  # the recipe passes its prompt options (`html`, `prompt_chars`)
  from configs import webrl as webrl_config  # pylint: disable=g-import-not-at-top
  config = webrl_config.get_config()
  config.prompt_chars = 300
  rows = data.step_rows([traj], [1.0], **data.row_options(config))
  assert rows["next_state"] == [got]
  # without a stored observation, the page its prompt carries
  bare = _episode("Open apparel", HTMLS[:1], REPLIES[:1], observed=False)
  assert webrl.current_html(data.final_state(bare)) == HTMLS[0]
