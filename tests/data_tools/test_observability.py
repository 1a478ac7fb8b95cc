"""The observability check's overrides and refusals (its measurements are tested with each recipe's bench
variant: tests/recipes/test_webrl.py, test_openwebvoyager.py)."""

import pytest

from data_tools import observability
from jaxagent.main import load_config_file


def test_overrides_parse_literals_keep_the_key_type_and_refuse_unknown_keys():
  config = load_config_file("configs/webrl.py:bench")
  observability.override(config, "prompt_chars=2048")
  observability.override(config, "tasks.templates=")
  observability.override(config, "early_stop.repeats=3")
  assert config.prompt_chars == 2048 and config.tasks.templates == "" and config.early_stop.repeats == 3
  with pytest.raises(KeyError, match="no key 'tasks.colour'"):
    observability.override(config, "tasks.colour=red")


def test_refuses_a_screen_observation_and_a_suite_off_the_benchmark():
  with pytest.raises(ValueError, match="text observations only"):
    observability.measure(load_config_file("configs/digiq.py"))
  with pytest.raises(ValueError, match="tasks.suite must be 'bench'"):
    observability.measure(load_config_file("configs/webrl.py"))
