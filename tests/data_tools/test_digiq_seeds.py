"""The Digi-Q seeds tool's config overrides and its refusal to run on unfinished data."""

import pytest

from data_tools import digiq_seeds


def test_overrides_are_cast_to_the_field_type_and_seed_is_set():
  config = digiq_seeds.load_config("configs/digiq.py:smoke", [
      "--config.critic.advantage_estimation=bellman", "--config.critic.train.steps=7", "--config.actor.il_weight=0",
      "--config.train.progress_bar=false"], seed=5)
  assert config.critic.advantage_estimation == "bellman" and config.critic.train.steps == 7
  assert config.actor.il_weight == 0.0 and isinstance(config.actor.il_weight, float)
  assert config.train.progress_bar is False and config.seed == 5


def test_bad_overrides_name_the_field():
  with pytest.raises(SystemExit, match="critic.train.stepz"):
    digiq_seeds.load_config("configs/digiq.py", ["--config.critic.train.stepz=3"], seed=0)
  with pytest.raises(SystemExit, match="--config.critic.train.steps=800"):
    digiq_seeds.load_config("configs/digiq.py", ["critic.steps=3"], seed=0)


def test_unfinished_workdir_is_refused(tmp_path):
  with pytest.raises(SystemExit, match="tasks"):
    digiq_seeds.link_data(str(tmp_path / "run"), str(tmp_path / "seed0"))
