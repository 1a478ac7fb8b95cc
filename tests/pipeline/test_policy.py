"""One policy and one loader: the acting prompt is the training render, byte for byte; all rows in one sampler
call; a trained actor's directory says how it acts (`agent.json`)."""

import dataclasses
import json

import numpy as np
import pytest

from jaxagent import types
from jaxagent.agents import get_format, spec as agent_spec
from jaxagent.agents.webrl import WebRL
from jaxagent.data import conversation
from jaxagent.data.tokenizer import IMAGE_TOKEN
from jaxagent.pipeline import device
from jaxagent.pipeline.policy import ModelPolicy, load
from jaxagent.serving.checkpoint import export_policy, random_policy
from jaxagent.serving.engine import Engine, GenerationRequest
from jaxagent.types import Action, ActionKind, Observation, Step


def _decoder():
  return random_policy("decoder", num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128)


def test_the_autoui_prompt_is_the_training_render_of_the_same_turn():
  loaded = random_policy("vlm", seed=0, image_size=32)
  obs = types.Observation(url="u", screenshot=np.zeros((915, 412, 3), np.uint8), intent="Open the Shop")
  policy = ModelPolicy(loaded, device.FORMAT, temperature=0.0, max_tokens=4, max_batch=2)
  prompt, images = policy.prompt(obs, [])
  sample = device.sample("s", "img.png", device.FORMAT.build_prompt(obs.intent, obs, []), "ACTION")
  trained, _ = conversation.render(sample["conversations"], loaded.tokenizer.bos_token)
  assert trained.startswith(prompt) and trained[len(prompt):] == " ACTION<end_of_utterance>\n"
  assert len(images) == 1 and images[0].shape == (228, 103, 3) and prompt.count(IMAGE_TOKEN) == 1
  assert len(policy.act([obs, obs], [[], []])) == 2


def test_the_engine_renders_chat_messages_as_training_does():
  engine = Engine(random_policy("vlm", seed=0, image_size=32), max_batch=1)
  messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Goal: x"}]}]
  turns = [{"from": "human", "value": f"{IMAGE_TOKEN}\nGoal: x"}]
  assert engine.render(messages) == engine.training_prompt(turns)


def _rows():
  obs = [Observation(url=f"http://127.0.0.1/s/{i}/shop/", intent=f"Find the price of item {i}", step=0,
                     a11y_tree=f"[1] link 'Item {i}'\n[2] textbox 'Search'", html=f"<a id='1'>Item {i}</a>")
         for i in range(3)]
  fmt = get_format("webvoyager_text")
  first = Step(step=0, obs_text=fmt.observation_text(obs[2].intent, obs[2], []),
               action_text="Thought: open it.\n\nAction: Click [1]", action=Action(ActionKind.CLICK, element=1))
  return obs, [[], [], [first]]


@pytest.mark.parametrize("format_name", ["webvoyager_text", "webrl"])
def test_all_rows_are_one_sampler_call_on_the_formats_prompts(format_name):
  """A completion format (WebRL) is prompted with the training render of its one human turn, as the recipe trains
  it; a chat format with a system prompt (WebVoyager) goes to the chat template as messages."""
  engine = Engine(_decoder(), max_batch=8, max_new_tokens=16, max_prompt_tokens=4096)
  policy = ModelPolicy(engine.policy, format_name, engine, temperature=0.0, max_tokens=8)
  obs, histories = _rows()
  calls = engine.stats()["sampler_calls"]
  texts = policy.act(obs, histories)
  assert engine.stats()["sampler_calls"] == calls + 1  # three rows, one sampler call
  fmt = get_format(format_name)
  prompts = [fmt.build_prompt(o.intent, o, h) for o, h in zip(obs, histories)]
  if format_name == "webvoyager_text":
    assert [m["role"] for m in prompts[2]] == ["system", "user", "assistant", "user"]
  else:  # the human turn in the chat template, as training rendered it: not the bare completion string
    raw, prompts = prompts, [engine.training_prompt([{"from": "human", "value": p}]) for p in prompts]
    assert all(r in p and r != p for r, p in zip(raw, prompts))
  direct = engine.generate([GenerationRequest(p, max_tokens=8, temperature=0.0) for p in prompts])
  assert texts == [r.text.strip() for r in direct]


def test_a_prompt_longer_than_the_context_gets_the_empty_reply_and_is_counted():
  policy = ModelPolicy(_decoder(), "webrl", temperature=0.0, max_tokens=4, max_batch=2)
  obs, _ = _rows()
  fits = policy.engine.prepare(GenerationRequest(policy.prompt(obs[0], [])[0], max_tokens=4))
  policy.engine.max_prompt_tokens = len(fits.ids) + 8
  long = Observation(url="u", intent="x " * 400, html="<p>y</p>")
  assert policy.act([long, obs[0]], [[], []])[0] == ""
  assert policy.stats["too_long"] == 1 and policy.stats["rows"] == 2


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  loaded = _decoder()
  return loaded, export_policy(loaded, str(tmp_path_factory.mktemp("actor")))


def test_load_acts_as_the_agent_json_says(exported):
  loaded, path = exported
  fmt = WebRL(compact=True, max_prompt_chars=900, stop_parse_failures=5, stop_repeats=3)
  agent_spec.write(path, fmt, loaded.tokenizer.chat_template)
  policy = load(path, temperature=0.0, max_tokens=4)
  assert agent_spec.to_spec(policy.fmt, None) == agent_spec.to_spec(fmt, None)
  assert policy.fmt.compact and policy.fmt.max_prompt_chars == 900 and policy.fmt.stop_repeats == 3
  assert load(path, temperature=0.0, fmt="webvoyager_text").fmt.name == "webvoyager_text"  # an explicit format wins


def test_load_with_a_prefix_cache_prefills_an_episodes_next_step_after_the_last_ones_keys(exported):
  """`load(..., prefix_cache_bytes=)` (`jaxagent.evaluate --prefix-cache-mb`): at batch 1, the second step of an
  episode reuses what its prompt shares with the first (WebRL's task and history come before the page) and replies
  as the policy without the cache does; AutoUI's engine, which keeps no keys, refuses it."""
  loaded, path = exported
  agent_spec.write(path, WebRL(), loaded.tokenizer.chat_template)
  cached = load(path, temperature=0.0, max_tokens=4, prefix_cache_bytes=1 << 26)
  plain = load(path, temperature=0.0, max_tokens=4)
  page = lambda n: Observation(url="http://127.0.0.1/shop/", intent="Find the price of the blue kettle " * 60,
                               step=n, html="<a id='1'>Kettle</a>" * (20 + n))  # ~700 tokens of task, ~200 of page
  click = Step(step=0, action_text='do(action="Click", element="1")', action=Action(ActionKind.CLICK, element=1))
  for obs, history in ((page(0), []), (page(1), [click])):
    assert cached.act([obs], [history]) == plain.act([obs], [history])
  assert cached.engine.stats()["prefix_tokens_reused"] >= 64
  assert "prefix_tokens_reused" not in plain.engine.stats()
  with pytest.raises(ValueError, match="prefix_cache_bytes: .* autoui model"):
    ModelPolicy(dataclasses.replace(loaded, kind="autoui"), device.FORMAT, prefix_cache_bytes=1 << 20)


def test_load_refuses_a_tokenizer_whose_chat_template_is_not_the_trained_ones(exported, tmp_path):
  loaded, path = exported
  agent_spec.write(path, WebRL(), "{{ messages }}")
  with pytest.raises(ValueError, match="chat template differs"):
    load(path, temperature=0.0)
  agent_spec.write(path, WebRL(), loaded.tokenizer.chat_template)


def test_without_agent_json_load_asks_for_the_format(tmp_path):
  path = export_policy(_decoder(), str(tmp_path / "hf"))
  with pytest.raises(FileNotFoundError, match="--format"):
    load(path, temperature=0.0)
  assert load(path, temperature=0.0, fmt="webrl").fmt.name == "webrl"


def test_a_damaged_agent_json_is_an_error_naming_the_file_and_key(tmp_path):
  with open(tmp_path / "agent.json", "w") as f:
    json.dump({"format": "autoui", "options": {}, "parse": 3}, f)
  with pytest.raises(ValueError, match=r"agent.json: 'parse' must be a str"):
    agent_spec.from_spec(agent_spec.read(str(tmp_path)), str(tmp_path / "agent.json"))
  with pytest.raises(ValueError, match=r"parses by \['lenient', 'faithful'\]"):
    agent_spec.from_spec({"format": "autoui", "options": {}, "parse": "strict"})


@pytest.mark.parametrize("name", ["autoui", "webrl", "openwebvoyager", "openwebvoyager_compact", "webvoyager",
                                  "webvoyager_text", "webvoyager_actree_image"])
def test_every_format_rebuilds_from_its_spec(name):
  fmt = get_format(name)
  again = agent_spec.from_spec(json.loads(json.dumps(agent_spec.to_spec(fmt, None))))
  assert type(again) is type(fmt) and again.options() == fmt.options() and again.parse_rule == fmt.parse_rule
  faithful = agent_spec.from_spec({"format": "autoui", "options": {}, "parse": "faithful"})
  assert faithful.faithful_task_impossible
