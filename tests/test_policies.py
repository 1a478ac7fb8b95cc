"""`ModelPolicy`: the agent format's prompts for every row, one sampler call per `act`; configs; `OpenAIPolicy`
refuses completion formats. (OpenAIPolicy's rollout against a real server: `tests/serving/test_e2e.py`.)"""

import pytest

from jaxagent import policies
from jaxagent.agents import get_format
from jaxagent.serving.checkpoint import random_policy
from jaxagent.serving.engine import Engine, GenerationRequest
from jaxagent.types import Action, ActionKind, Observation, Step


@pytest.fixture(scope="module")
def engine():
  return Engine(random_policy("decoder", num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128),
                max_batch=8, max_new_tokens=16, max_prompt_tokens=4096)


def _rows():
  obs = [Observation(url=f"http://127.0.0.1/s/{i}/shop/", intent=f"Find the price of item {i}", step=0,
                     a11y_tree=f"[1] link 'Item {i}'\n[2] textbox 'Search'") for i in range(3)]
  fmt = get_format("webvoyager_text")
  first = Step(step=0, obs_text=fmt.observation_text(obs[2].intent, obs[2], []),
               action_text="Thought: open it.\n\nAction: Click [1]", action=Action(ActionKind.CLICK, element=1))
  return obs, [[], [], [first]]


@pytest.mark.parametrize("format_name", ["webvoyager_text", "webrl"])
def test_model_policy_batches_the_formats_prompts(engine, format_name):
  policy = policies.ModelPolicy(engine, format_name, temperature=0.0, max_tokens=8)
  obs, histories = _rows()
  calls = engine.stats()["sampler_calls"]
  texts = policy.act(obs, histories)
  assert engine.stats()["sampler_calls"] == calls + 1  # three rows, one sampler call
  fmt = get_format(format_name)
  prompts = [fmt.build_prompt(o.intent, o, h) for o, h in zip(obs, histories)]
  if format_name == "webvoyager_text":
    assert [m["role"] for m in prompts[2]] == ["system", "user", "assistant", "user"]
  direct = engine.generate([GenerationRequest(p, max_tokens=8, temperature=0.0) for p in prompts])
  assert texts == [r.text for r in direct]


def test_make_policy_and_configs(tmp_path):
  with pytest.raises(ValueError, match="unknown key"):
    policies.OpenAIPolicyConfig.from_config({"modle": "x"})
  with pytest.raises(ValueError, match="'checkpoint'"):
    policies.make_policy({"kind": "model"})
  with pytest.raises(ValueError, match="policy kind"):
    policies.make_policy({"kind": "oracle"})
  openai_policy = policies.make_policy({"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"})
  assert openai_policy.fmt.name == "webvoyager_actree_image" and openai_policy.fmt.max_attached_imgs == 3
  with pytest.raises(ValueError, match="chat agent format"):
    policies.OpenAIPolicy({"agent_format": "webrl"})


def test_history_with_images_uses_in_memory_screenshots():
  import numpy as np
  shot = np.zeros((4, 4, 3), np.uint8)
  steps = [Step(step=0, observation=Observation(screenshot=shot)), Step(step=1, image_path="images/a.png"),
           Step(step=2)]
  out = policies.history_with_images(steps)
  assert out[0].image_path is shot and out[1].image_path == "images/a.png" and out[2].image_path is None
  assert steps[0].image_path is None  # the caller's steps are untouched
