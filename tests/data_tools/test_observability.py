"""The observability check's refusals (its measurements are tested with each recipe's bench variant:
tests/recipes/test_webrl.py, test_openwebvoyager.py; the phone's text observation here; its --config overrides are
`jaxagent.main`'s, tests/test_main.py)."""

import pytest

from data_tools import observability
from jaxagent.main import load_config_file


def test_refuses_a_screen_observation_and_a_suite_off_the_benchmark():
  with pytest.raises(ValueError, match="text observations only"):
    observability.measure(load_config_file("configs/digiq.py"))
  with pytest.raises(ValueError, match="tasks.suite must be 'bench'"):
    observability.measure(load_config_file("configs/webrl.py"))
  with pytest.raises(ValueError, match="env.observation='screenshot'"):
    observability.measure(load_config_file("configs/digirl.py", ["--config.tasks.suite=bench"]))


@pytest.mark.slow
def test_the_phones_text_observation_shows_what_its_cut_keeps_of_the_experts_elements():
  """The phone's page as text (DigiRL's `env.observation=html`): the expert solves a draw of the headline in the
  text backend, every element it acts on is on the whole page, and a shorter cut shows fewer of them."""
  config = load_config_file("configs/digirl.py:text=1", ["--config.tasks.suite=bench", "--config.tasks.templates="])
  total = observability.measure(config, episodes=6)["total"]
  assert total["intents"] == total["expert_successes"] == 6
  assert total["element_steps"] > 0 and total.get("not_in_full_observation", 0) == 0
  config.data.page_chars = 300
  assert observability.measure(config, episodes=6)["total"]["shown"] < total["shown"]
