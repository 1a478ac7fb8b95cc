"""The acting prompt is the training render, byte for byte, through the policy and through the engine's chat
messages (the server's path)."""

import numpy as np

from jaxagent import types
from jaxagent.data import conversation
from jaxagent.data.tokenizer import IMAGE_TOKEN
from jaxagent.pipeline.policy import VLMPolicy, render_prompt
from jaxagent.pipeline import device as digiq_data
from jaxagent.serving.checkpoint import random_policy
from jaxagent.serving.engine import Engine


def test_policy_prompt_is_the_training_render_of_the_same_turn():
  loaded = random_policy("vlm", seed=0, image_size=32)
  obs = types.Observation(url="u", screenshot=np.zeros((915, 412, 3), np.uint8), intent="Open the Shop")
  turns, images = digiq_data.prompt_fn(obs, [])
  sample = digiq_data.sample("s", "img.png", digiq_data.FORMAT.build_prompt(obs.intent, obs, []), "ACTION")
  trained, _ = conversation.render(sample["conversations"], loaded.tokenizer.bos_token)
  prompt = render_prompt(turns, loaded.tokenizer)
  assert trained.startswith(prompt) and trained[len(prompt):] == " ACTION<end_of_utterance>\n"
  assert len(images) == 1 and prompt.count(IMAGE_TOKEN) == 1
  policy = VLMPolicy(loaded, digiq_data.FORMAT, digiq_data.prompt_fn, temperature=0.0, max_tokens=4, max_batch=2)
  assert len(policy.act([obs, obs], [[], []])) == 2


def test_engine_renders_chat_messages_as_training_does():
  engine = Engine(random_policy("vlm", seed=0, image_size=32), max_batch=1)
  messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Goal: x"}]}]
  turns = [{"from": "human", "value": f"{IMAGE_TOKEN}\nGoal: x"}]
  assert engine.render(messages) == render_prompt(turns, engine.policy.tokenizer)
