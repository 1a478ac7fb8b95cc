"""The WebRL instruction probe on hand-built episodes: step kinds, the clicked category against the intent's."""

import os

import numpy as np

from data_tools import webrl_instruction_probe as probe
from jaxagent.data.store import TrajectoryStore
from jaxagent.types import Step, Task, Trajectory

COOKIES = '# Note: I will click "Accept cookies".\ndo(action="Click", element="29")'
STOP = '# Note: The task is complete.\nexit(message="Done.")'


def _click(name, element):
  return f'# Note: I will click "{name}".\ndo(action="Click", element="{element}")'


def _episode(k, intent, category, success):
  steps = [COOKIES, _click(category, 5), _click("Most reviews", 44), STOP]
  return Trajectory(task=Task(id=f"t{k}", intent=intent, site="shop", start_url="u"), success=success,
                    steps=[Step(step=i, obs_text="p", action_text=a) for i, a in enumerate(steps)])


def test_step_kinds_and_categories():
  assert [probe.step_kind(a) for a in (COOKIES, _click("Office", 11), _click("Price: low to high", 41), STOP)] == [
      "cookies", "category", "order", "stop"]
  assert probe.intent_category("On Shoply, list the home category with the most reviewed first.") == "home"
  assert probe.intent_category("On Shoply, list everything.") is None
  assert probe.clicked_category(_episode(0, "x", "Kitchen", 0.0)) == "kitchen"


def test_a_policy_that_clicks_one_category_is_told_apart(tmp_path):
  store = TrajectoryStore(str(tmp_path / "eval" / "phase1"))
  intents = [f"On Shoply, list the {c} category with the most reviewed first." for c in ("home", "office", "audio")]
  for k, intent in enumerate(intents):  # always "Home": right (and solved) on the home task only
    store.append(_episode(k, intent, "Home", 1.0 if k == 0 else 0.0))
  report = probe.eval_report(os.path.join(tmp_path, "eval", "phase1"))
  assert report["episodes"] == 3 and report["most_clicked"] == "home" and report["most_clicked_share"] == 1.0
  assert abs(report["category_right"] - 1 / 3) < 1e-9 and abs(report["success"] - 1 / 3) < 1e-9
  assert report["intent_categories"] == 3


def test_part_logprobs_sum_the_tokens_of_the_quoted_name_and_of_the_element_id():
  from jaxagent.data import conversation
  from jaxagent.data.tokenizer import load_tokenizer
  tokenizer = load_tokenizer(None, require_image_token=False)
  reply = _click("Office Supplies", 117)
  sample = {"id": "s", "images": [], "conversations": [{"from": "human", "value": "p"}, {"from": "gpt", "value": reply}]}
  ids, loss = conversation.tokenize(sample, tokenizer, 1)
  reply_ids = ids[loss > 0]
  token_logp = -(2.0 ** np.arange(len(reply_ids)))  # each token its own bit: a part's sum names its tokens
  parts = probe.part_logprobs(tokenizer, reply, reply_ids, token_logp)

  def tokens_of(value):
    bits = int(round(-value))
    return [int(t) for k, t in enumerate(reply_ids) if bits >> k & 1]

  name, element = tokenizer.decode(tokens_of(parts["name"])), tokenizer.decode(tokens_of(parts["id"]))
  assert "Office Supplies" in name and "element" not in name and "117" not in name
  assert "117" in element and "Office" not in element and len(element.strip()) <= len('="117")')
  assert probe.part_logprobs(tokenizer, STOP, reply_ids, token_logp) == {}  # not this reply's tokens


def _search(text):
  return f'# Note: I will type "{text}" into the field.\ndo(action="Search", argument="{text}", element="1")'


def test_typed_arguments_are_told_copied_from_the_intent_or_repeated_from_a_demonstration(tmp_path):
  demos = TrajectoryStore(str(tmp_path / "demos"))
  demos.append(Trajectory(task=Task(id="d", intent="Buy the Orla Lamp A1.", site="shop", start_url="u"),
                          success=1.0, steps=[Step(step=0, obs_text="p", action_text=_search("Orla Lamp A1"))]))
  store = TrajectoryStore(str(tmp_path / "eval"))
  for k, typed in enumerate(("Kestrel Pan B2", "Orla Lamp A1", "Orla Lamp")):
    store.append(Trajectory(task=Task(id=f"t{k}", intent="Buy the Kestrel Pan B2.", site="shop", start_url="u"),
                            success=0.0, steps=[Step(step=0, obs_text="p", action_text=_search(typed)), Step(
                                step=1, obs_text="p", action_text=STOP)]))
  assert probe.copy_report(str(tmp_path / "eval"), str(tmp_path / "demos")) == {
      "typed": 3, "from_the_intent": 1, "a_demonstration_argument": 1, "demonstration_arguments": 1}


def test_copy_steps_ask_the_demonstrations_strings_as_recorded_and_swapped():
  intent = "Reply to the thread \u201cBest mugs\u201d with the message \u201cSo true.\u201d."
  steps = [_click("Best mugs", 7), '# Note: I will type "So true." into the field.\ndo(action="Type", '
           'argument="So true.", element="16")', STOP]
  traj = Trajectory(task=Task(id="t", intent=intent, site="forum", start_url="u", meta={"texts": ["So true."]}),
                    success=1.0, steps=[Step(step=i, obs_text=f"Task Instruction: {intent}\n<p> page {i}",
                                             action_text=a) for i, a in enumerate(steps)])
  recorded = probe.copy_steps([traj])
  assert [want for _, want in recorded] == ["So true."]  # the click writes no string, the stop's "Done." is none
  (turns, swapped), = probe.copy_steps([traj], copies=1, seed=3)
  assert swapped != "So true." and swapped in turns[0]["value"] and "So true." not in turns[0]["value"]
