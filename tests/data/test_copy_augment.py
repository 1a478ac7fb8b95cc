"""Copy augmentation: made-up strings keep their shape, and a swapped copy of a demonstration is the same episode
with only those strings changed, everywhere."""

import random

import pytest

from jaxagent.data import copy_augment
from jaxagent.types import Step, Task, Trajectory


def test_a_surrogate_keeps_the_shape_and_changes_every_word():
  words = copy_augment.vocabulary(["Kestrel Studio Frying Pan H46", "Thoughts on rest days this year"])
  assert words == sorted(set(words)) and "kestrel" in words and "h" not in words
  text = "Kestrel Studio Frying Pan H46, (part 3)!"
  shape = lambda tok: "".join("9" if c.isdigit() else "A" if c.isupper() else "a" for c in tok)  # noqa: E731
  for seed in range(20):
    made = copy_augment.surrogate(text, words, random.Random(seed))
    old, new = copy_augment._TOKEN.findall(text), copy_augment._TOKEN.findall(made)
    assert len(old) == len(new)
    for a, b in zip(old, new):
      if not a[0].isalnum():
        assert a == b  # spaces and punctuation kept
      elif any(c.isdigit() for c in a):
        assert shape(a) == shape(b)  # H46 → another capital and two digits
      else:
        assert b.lower() in words and b.lower() != a.lower() and b[0].isupper() == a[0].isupper()


def _episode(intent, texts, replies, pages):
  task = Task(id="t", intent=intent, site="shop", start_url="u", meta={"texts": texts})
  steps = [Step(step=i, obs_text=f"Task Instruction: {intent}\n{p}", action_text=r)
           for i, (r, p) in enumerate(zip(replies, pages))]
  return Trajectory(task=task, success=1.0, steps=steps)


def test_a_copy_swaps_the_strings_everywhere_and_nothing_else():
  name, other = "Orla Travel Cushion S80", "Nordvik Eco Lamp D21"
  t = _episode(f"Add the {name} to my cart.", [name],
               [f'do(action="Search", argument="{name}", element="1")', 'do(action="Click", element="7")'],
               ['<input id="1">', f'<a id="7"> {name} </a> <a id="8"> {other} </a>'])
  unswappable = _episode("Open the orders.", [], ['do(action="Click", element="4")'], ['<a id="4"> Orders </a>'])
  out = copy_augment.copies([t, unswappable], 3, seed=0)
  assert [it["id"] for it in out] == [f"t-copy{k}-{s}" for k in range(3) for s in (0, 1)]
  made = set()
  for it in out:
    prompt, reply = it["conversations"][0]["value"], it["conversations"][1]["value"]
    assert name not in prompt and name not in reply
    assert (other in prompt) == it["id"].endswith("-1")  # the page's other strings kept
    new = prompt.split("Add the ", 1)[1].split(" to my cart.", 1)[0]
    made.add(new)
    original = t.steps[int(it["id"][-1])]
    assert prompt.replace(new, name) == original.obs_text and reply.replace(new, name) == original.action_text
  assert len(made) == 3  # each copy its own string, the same in every step of that copy


@pytest.mark.slow
def test_the_experts_benchmark_demonstrations_copy_and_still_parse(tmp_path):
  """On WebRL's bench demonstrations (text backend): every swapped reply parses to the original's action but for
  the swapped strings, and no copy keeps a typed or answered string of its episode."""
  from configs import webrl as webrl_config  # pylint: disable=g-import-not-at-top
  from jaxagent.envs.sites.expert import ScriptedExpert  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline import device, tasks as tasks_lib  # pylint: disable=g-import-not-at-top
  from jaxagent.proj.webrl import data  # pylint: disable=g-import-not-at-top
  from jaxagent.recipes import webrl  # pylint: disable=g-import-not-at-top
  config = webrl_config.get_config("bench")
  tasks = tasks_lib.draw_episodes(tasks_lib.bench_splits(config, "text")["train_a"], 24, 0, "demo")
  trajs = device.rollout(config, webrl.env_spec(config, expert=True),
                         ScriptedExpert("webrl", **webrl.format_options(config)), tasks, str(tmp_path), "expert",
                         gamma=data.GAMMA)
  items = data.sft_samples(trajs, copies=1, seed=0)
  originals = {f"{t.task.id}-{s.step}": (t, s) for t in trajs for s in t.steps}
  copies = [it for it in items if "-copy0-" in it["id"]]
  assert len(items) == len(originals) + len(copies) and len(copies) > len(originals) // 2
  fmt = webrl.agent_format(config)
  for it in copies:
    t, s = originals[it["id"].replace("-copy0-", "-")]
    prompt, reply = it["conversations"][0]["value"], it["conversations"][1]["value"]
    assert not any(text in prompt or text in reply for text in t.task.meta["texts"])
    got, want = fmt.parse(reply), fmt.parse(s.action_text)
    assert (got.kind, got.element) == (want.kind, want.element)
