"""`make_policy` and the OpenAI policy's config; `OpenAIPolicy` refuses completion formats. (OpenAIPolicy's rollout against a real server: `tests/serving/test_e2e.py`.)"""

import pytest

from jaxagent import policies
from jaxagent.types import Observation, Step


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


def test_a_bad_openai_policy_setting_is_refused_naming_the_key_and_the_fix():
  with pytest.raises(ValueError, match=r"OpenAIPolicyConfig: concurrency=0 must be an integer >= 1 .*; set concurrency="):
    policies.OpenAIPolicyConfig(concurrency=0)
  with pytest.raises(ValueError, match=r"OpenAI policy config: timeout_s=-5 must be a number > 0 .*; set timeout_s="):
    policies.OpenAIPolicy({"timeout_s": -5})
  with pytest.raises(ValueError, match=r"OpenAI policy config: max_retries='2' must be an integer >= 0"):
    policies.OpenAIPolicy({"max_retries": "2"})


def test_history_with_images_uses_in_memory_screenshots():
  import numpy as np
  shot = np.zeros((4, 4, 3), np.uint8)
  steps = [Step(step=0, observation=Observation(screenshot=shot)), Step(step=1, image_path="images/a.png"),
           Step(step=2)]
  out = policies.history_with_images(steps)
  assert out[0].image_path is shot and out[1].image_path == "images/a.png" and out[2].image_path is None
  assert steps[0].image_path is None  # the caller's steps are untouched
