"""The observability check's refusals (its measurements are tested with each recipe's bench variant:
tests/recipes/test_webrl.py, test_openwebvoyager.py; its --config overrides are `jaxagent.main`'s,
tests/test_main.py)."""

import pytest

from data_tools import observability
from jaxagent.main import load_config_file


def test_refuses_a_screen_observation_and_a_suite_off_the_benchmark():
  with pytest.raises(ValueError, match="text observations only"):
    observability.measure(load_config_file("configs/digiq.py"))
  with pytest.raises(ValueError, match="tasks.suite must be 'bench'"):
    observability.measure(load_config_file("configs/webrl.py"))
