"""The shared client's config: numbers a request cannot run with are refused up front, naming the key."""

import pytest

from jaxagent import openai_client


@pytest.mark.parametrize("key, value, rule", [("timeout_s", 0, "a number > 0"), ("deadline_s", -1.0, "a number >= 0"),
                                              ("max_retries", 1.5, "an integer >= 0"),
                                              ("backoff_max_s", "30", "a number >= 0"),
                                              ("max_tokens", True, "an integer >= 1")])
def test_a_bad_client_setting_is_refused_naming_the_key_and_the_fix(key, value, rule):
  with pytest.raises(ValueError, match=rf"ClientConfig: {key}={value!r} must be {rule} .*; set {key}="):
    openai_client.ClientConfig(**{key: value})


def test_the_defaults_and_edge_values_pass():
  openai_client.ClientConfig()
  openai_client.ClientConfig(deadline_s=0, max_retries=0, backoff_initial_s=0, temperature=0, timeout_s=0.5)
