"""The MiniWoB++ training suite: scripted solvers in real Chromium, seed splits, the expert in WebRL's format."""

import pytest

from jaxagent import agents
from jaxagent.envs import miniwob
from jaxagent.envs import miniwob_solvers as solvers
from jaxagent.types import Action, ActionKind, Element, Observation, Step

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def env():
  e = miniwob.MiniWoBEnv(observation="html")
  yield e
  e.close()


def test_train_and_test_seeds_never_overlap_and_suites_carry_their_split():
  train, test = miniwob.split_seeds("train", 1000), miniwob.split_seeds("test", 1000)
  assert len(train) == len(test) == 1000 and not set(train) & set(test)
  assert max(miniwob.split_seeds("train", miniwob.TEST_SEED_BASE)) < min(test)
  with pytest.raises(ValueError, match="split="):
    miniwob.split_seeds("valid", 3)
  with pytest.raises(ValueError, match="n="):
    miniwob.split_seeds("train", miniwob.TEST_SEED_BASE + 1)
  tasks = miniwob.training_suite("test", 2)
  assert len(tasks) == 2 * len(miniwob.TRAINING_TASKS) >= 24
  assert {t.split for t in tasks} == {"test"} and tasks[0].id == f"miniwob/{miniwob.TRAINING_TASKS[0]}/1000000"
  assert {t.max_steps for t in tasks} == {6}
  assert set(miniwob.TRAINING_TASKS) <= set(solvers.SOLVERS) and len(miniwob.TRAINING_TASKS) >= 12


@pytest.mark.parametrize("name", miniwob.TRAINING_TASKS)
@pytest.mark.slow
def test_solver_succeeds_on_train_and_test_seeds_and_the_expert_says_the_same_in_webrl(env, name):
  expert = solvers.MiniWoBExpert()
  for split in ("train", "test"):
    for seed in miniwob.split_seeds(split, 2):
      task = miniwob.make_task(name, seed=seed, max_steps=6, split=split)
      obs, history, reward, done = env.reset(task), [], 0.0, False
      while not done:
        prompt = expert.fmt.build_prompt(obs.intent, obs, history)
        assert prompt.startswith(f"Task Instruction: {obs.intent}") and len(prompt) <= 2000
        text = expert.act([obs], [history])[0]
        action = expert.fmt.parse(text)
        assert action == solvers.SOLVERS[name](obs, history), text
        obs, reward, done, _ = env.step(action)
        history.append(Step(step=len(history), action_text=text, action=action, reward=reward, done=done))
      assert reward == 1.0, f"{name} seed {seed}: {[s.action_text for s in history]}"


@pytest.mark.slow
def test_webrl_ids_click_and_type_on_miniwob_html(env):
  fmt = agents.get_format("webrl")
  obs = env.reset(miniwob.make_task("login-user", seed=5))
  user, password = solvers.quoted(obs.intent)
  assert '<input id="0" type="text"' in obs.html and '<button id="2"' in obs.html
  for element, text in ((0, user), (1, password)):
    obs, _, _, _ = env.step(fmt.parse(fmt.render(Action(ActionKind.TYPE, element=element, text=text))))
  assert f'id="0" value="{user}"' in obs.html and f'id="1" value="{password}"' in obs.html
  _, reward, done, _ = env.step(fmt.parse(fmt.render(Action(ActionKind.CLICK, element=2))))
  assert reward == 1.0 and done


@pytest.mark.slow
def test_pages_are_served_as_utf8(env):
  obs = env.reset(miniwob.make_task("unicode-test", seed=0))
  assert "Ã" not in obs.intent + obs.html and any(ord(c) > 127 for c in obs.intent)


def test_expert_comment_line_and_a_page_it_cannot_read():
  expert = solvers.MiniWoBExpert()
  obs = Observation(url="http://127.0.0.1:1/miniwob/click-button.html", intent='Click on the "Ok" button.',
                    html='<html> <body> Click on the &quot;Ok&quot; button. <button id="3"> Ok </button> '
                         '</body> </html>')
  obs.elements = [Element(3, "button", "Ok")]
  text = expert.act([obs], [[]])[0]
  assert text == '# Element: the \'Ok\' button\ndo(action="Click", element="3")'
  assert expert.fmt.parse(text) == Action(ActionKind.CLICK, element=3)
  obs.html = "<html> <body> </body> </html>"  # the button is gone: the expert stops instead of raising
  stop = expert.fmt.parse(expert.act([obs], [[]])[0])
  assert stop.kind == ActionKind.ANSWER and "cannot solve" in stop.text
  with pytest.raises(ValueError, match="no MiniWoB solver"):
    expert.act([Observation(url="http://127.0.0.1:1/miniwob/drag-box.html")], [[]])
  with pytest.raises(ValueError, match="webrl"):
    solvers.MiniWoBExpert("autoui")


def test_page_reads_the_task_area_after_an_utterance_that_runs_on():
  obs = Observation(intent="Solve the math problem. Press submit.",
                    html='<html> <body> Solve the math problem. Press submit. 3 x 4 = <input id="0" type="text"> '
                         '</input> <button id="1"> Submit </button> </body> </html>')
  page = solvers.Page(obs)
  assert page.area_text(page.inputs("text")[0]) == "3 x 4 ="
  assert solvers.SOLVERS["simple-arithmetic"](obs, []) == Action(ActionKind.TYPE, element=0, text="12")
