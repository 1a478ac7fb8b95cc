"""MiniWoB++ from the `miniwob` package on real Chromium: suites, seeds, rewards from the page's JavaScript."""

import dataclasses
import re

import pytest

from jaxagent.envs import miniwob
from jaxagent.types import Action, ActionKind, Task

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def env():
  e = miniwob.MiniWoBEnv(observation="som")
  yield e
  e.close()


def test_task_names_cover_every_shipped_page():
  names = miniwob.task_names()
  html = miniwob.html_dir()
  pages = list((html / "miniwob").glob("*.html")) + list((html / "flight").glob("*/wrapper.html"))
  assert len(names) == len(pages) > 100
  assert {"click-button", "enter-text", "book-flight", "flight.Alaska"} <= set(names)
  assert all((html / miniwob.task_path(n)).exists() for n in names)
  tasks = miniwob.suite(["click-button", "enter-text"], seeds=range(3))
  assert [t.id for t in tasks[:3]] == ["miniwob/click-button/0", "miniwob/click-button/1", "miniwob/click-button/2"]
  assert tasks[0].start_url.startswith("http://127.0.0.1:")


def test_bad_task_names_and_foreign_tasks_are_rejected(env):
  with pytest.raises(ValueError, match="does not exist"):
    miniwob.make_task("click-buton")
  with pytest.raises(ValueError, match="not a MiniWoB task"):
    env.reset(Task(id="x", intent="", site="shop", start_url="http://127.0.0.1:1/"))


def _target(obs):
  return re.search(r'"(.+)"', obs.intent).group(1)


@pytest.mark.slow
def test_scripted_click_on_click_button_earns_reward_one(env):
  obs = env.reset(miniwob.make_task("click-button", seed=3))
  assert obs.intent.startswith("Click on the") and obs.screenshot.shape == (210, 160, 3)
  index = next(e.index for e in obs.elements if e.tag == "button" and e.text == _target(obs))
  assert f'[{index}]: <button> "{_target(obs)}";' in obs.element_text
  obs, reward, done, info = env.step(Action(ActionKind.CLICK, element=index))
  assert reward == 1.0 and done and info["raw_reward"] == 1 and 0 < info["env_reward"] <= 1


def test_a_stored_task_plays_on_this_processs_server_whatever_port_it_names(env):
  task = miniwob.make_task("click-button", seed=3)
  stale = dataclasses.replace(task, start_url="http://127.0.0.1:9/miniwob/click-button.html")  # a past run's port
  obs = env.reset(stale)
  assert obs.url == task.start_url and obs.intent.startswith("Click on the")


def test_wrong_button_earns_minus_one(env):
  for seed in range(20):  # find a seeded episode with a wrong button to press
    obs = env.reset(miniwob.make_task("click-button", seed=seed))
    wrong = [e.index for e in obs.elements if e.tag == "button" and e.text != _target(obs)]
    if wrong:
      break
  _, reward, done, _ = env.step(Action(ActionKind.CLICK, element=wrong[0]))
  assert reward == -1.0 and done


def test_typing_solves_enter_text(env):
  obs = env.reset(miniwob.make_task("enter-text", seed=0))
  field = next(e.index for e in obs.elements if e.tag == "input")
  obs, reward, done, _ = env.step(Action(ActionKind.TYPE, element=field, text=_target(obs)))
  assert reward == 0.0 and not done
  submit = next(e.index for e in obs.elements if e.text == "Submit")
  _, reward, done, _ = env.step(Action(ActionKind.CLICK, element=submit))
  assert reward == 1.0 and done


@pytest.mark.slow
def test_html_view_of_login_user_with_unnamed_textboxes_in_a11y(env):
  env.observation = "html"
  try:
    obs = env.reset(miniwob.make_task("login-user", seed=0))
    assert '<input id="0" type="text"' in obs.html and '<input id="1" type="password"' in obs.html
    assert "Last reward" not in obs.html  # the reward panel is hidden
    env.observation, env.a11y_keep_unnamed = "a11y", ("textbox",)
    obs = env.reset(miniwob.make_task("login-user", seed=0))
    boxes = [i for i, n in obs.a11y_nodes.items() if n["role"] == "textbox"]
    assert len(boxes) == 2
    user, password = re.findall(r'"([^"]+)"', obs.intent)
    env.step(Action(ActionKind.TYPE, element=boxes[0], text=user))
    env.step(Action(ActionKind.TYPE, element=boxes[1], text=password))
    login = next(i for i, n in obs.a11y_nodes.items() if n["role"] == "button" and n["name"] == "Login")
    _, reward, done, _ = env.step(Action(ActionKind.CLICK, element=login))
    assert reward == 1.0 and done
  finally:
    env.observation, env.a11y_keep_unnamed = "som", ()


@pytest.mark.slow
def test_seeds_reproduce_episodes_in_place_and_after_reload(env):
  utterances = [env.reset(miniwob.make_task("enter-text", seed=s)).intent for s in (7, 8, 7)]
  assert utterances[0] == utterances[2] != utterances[1]
  page = env.page
  env.reset(miniwob.make_task("enter-text", seed=8))
  assert env.page is page  # same task: restarted in place, no reload
  env.reload_every = 1
  try:
    assert env.reset(miniwob.make_task("enter-text", seed=7)).intent == utterances[0]
    assert env.page is not page  # reloaded in a fresh context, same seeded episode
  finally:
    env.reload_every = 200


def test_a11y_ids_on_miniwob_and_time_scaled_reward(env):
  env.observation, env.reward, env.episode_max_time_ms = "a11y", "time_scaled", None  # the discount's clock
  try:
    obs = env.reset(miniwob.make_task("click-button", seed=3))
    node = next(i for i, n in obs.a11y_nodes.items() if n["role"] == "button" and n["name"] == _target(obs))
    _, reward, done, info = env.step(Action(ActionKind.CLICK, element=node))
    assert done and 0 < reward < 1.0 and reward == info["env_reward"]
  finally:
    env.observation, env.reward, env.episode_max_time_ms = "som", "raw", 0
  with pytest.raises(ValueError, match="episode_max_time_ms"):
    miniwob.MiniWoBEnv(reward="time_scaled")  # a discount by a clock that is off


@pytest.mark.slow
def test_the_step_limit_not_the_pages_clock_ends_an_episode_unless_the_clock_is_asked_for():
  """A minute of page time (Playwright's fake clock: a slow machine, a compile, a big model) leaves the episode
  running by default; with the page's own limit (`episode_max_time_ms=None`, 10 s here) it ends with −1."""
  e = miniwob.MiniWoBEnv(observation="html")
  try:
    task = miniwob.make_task("click-button", seed=3)
    e.reset(task)
    e._page.clock.install()  # the timers of every episode started from here on are the fake clock's
    for max_time, ends in ((0, False), (None, True), (0, False), (500, True)):
      e.episode_max_time_ms = max_time
      e.reset(task)
      e._page.clock.run_for(60_000)
      reward, done, info = e._reward_done()
      assert done == ends, max_time
      assert (reward, info["reason"]) == ((-1.0, "timed out") if ends else (0.0, None)), max_time
  finally:
    e.close()
  for bad in (-1, True, 2**31):
    with pytest.raises(ValueError, match="episode_max_time_ms"):
      miniwob.MiniWoBEnv(episode_max_time_ms=bad)


@pytest.mark.slow
def test_flight_task_loads_in_its_iframe_wrapper(env):
  obs = env.reset(miniwob.make_task("flight.Alaska", seed=0))
  assert obs.intent and obs.screenshot.shape == (667, 375, 3)
  obs = env.reset(miniwob.make_task("click-button", seed=0))  # back to the small task viewport
  assert obs.screenshot.shape == (210, 160, 3)


@pytest.mark.slow
def test_a_reset_whose_page_states_no_goal_fails_and_the_next_reset_reloads():
  e = miniwob.MiniWoBEnv(observation="som")
  try:
    task = miniwob.make_task("click-button", seed=1)
    assert e.reset(task).intent
    e._page.evaluate("() => { core.getUtterance = () => ''; }")  # a page left without its goal
    with pytest.raises(RuntimeError, match="empty utterance"):
      e.reset(task)
    obs = e.reset(task)  # reloaded: the page's own getUtterance again
    assert obs.intent.startswith("Click on the")
  finally:
    e.close()
