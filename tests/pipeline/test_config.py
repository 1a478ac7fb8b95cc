"""Per-stage configs read every key; bad values are refused before any work, naming the key."""

import os
import subprocess
import sys
import time

import pytest

from configs import digiq as digiq_config
from configs import digirl as digirl_config
from configs import openwebvoyager as owv_config
from configs import webrl as webrl_config
from jaxagent.pipeline.config import ConfigError, stage_config, validate
from jaxagent.recipes import digiq, digirl, webrl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("module,sections", [(digiq_config, ("il", "representation", "critic", "actor")),
                                             (owv_config, ("il", "optimize"))])
def test_each_stage_trains_with_its_own_and_the_shared_values(module, sections):
  config = module.get_config(None)
  assert "steps" not in config.train and "lr" not in config.optim  # no shared value that every stage overrides
  config.optim.weight_decay = 0.25  # a shared value reaches every stage
  for name in sections:
    config[name].train.steps = 77
    config[name].optim.lr = 0.5
    c = stage_config(config, config[name])
    assert (c.train.steps, c.optim.lr, c.optim.weight_decay) == (77, 0.5, 0.25), name


def test_a_stage_run_for_other_steps_caps_its_intervals_at_them():
  config = digiq_config.get_config(None)
  c = stage_config(config, config.actor, steps=3)
  assert c.train.steps == 3 and config.actor.train.steps != 3  # the section itself unchanged
  assert c.train.log_every <= 3 and c.checkpoint.every <= 3 and c.optim.warmup_steps <= 1


def test_enumerated_values_and_missing_paths_are_refused_naming_the_key(tmp_path):
  config = digiq_config.get_config(None)
  validate(config, digiq.CHOICES, digiq.LISTS)
  config.critic.advantage_estimation = "MC"
  with pytest.raises(ConfigError, match=r"critic.advantage_estimation='MC' is not one of \('bellman', 'mc'\)"):
    validate(config, digiq.CHOICES, digiq.LISTS)
  paper = digiq_config.get_config("paper")
  with pytest.raises(ConfigError, match="model.hf_checkpoint is required"):
    validate(paper, digiq.CHOICES, digiq.LISTS)
  config = digiq_config.get_config(None)
  config.representation.hf_checkpoint = str(tmp_path / "missing")
  with pytest.raises(ConfigError, match="representation.hf_checkpoint=.*no such file"):
    validate(config, digiq.CHOICES, digiq.LISTS)


def test_an_unknown_env_backend_is_refused_before_any_work():
  config = digirl_config.get_config(None)
  config.env.backend = "k8s"
  with pytest.raises(ConfigError, match=r"config.env.backend='k8s' is not one of \('subprocess', 'ray'\)"):
    validate(config, digirl.CHOICES)


def test_the_text_backend_is_refused_where_the_agent_sees_the_screen_or_needs_boxes():
  config = digirl_config.get_config(None)
  config.env.browser = "text"
  validate(config, digirl.CHOICES)  # a browser DigiRL has, for its text observation (env.observation=html)
  with pytest.raises(ConfigError, match=r"config.env.browser='text'.*set --config.env.browser=chromium"):
    digirl.check_config(config)  # but not with the screenshots
  config = webrl_config.get_config(None)
  config.env.browser = "text"
  validate(config, webrl.CHOICES)
  webrl.check_config(config)  # compact HTML: no field needs a layout
  config.html = "full"
  with pytest.raises(ConfigError, match="data-bbox"):
    webrl.check_config(config)
  config.env.browser = "firefox"
  with pytest.raises(ConfigError, match=r"config.env.browser='firefox' is not one of \('chromium', 'text'\)"):
    validate(config, webrl.CHOICES)


def test_a_negative_policy_lag_is_refused_naming_the_key():
  config = digirl_config.get_config(None)
  validate(config, digirl.CHOICES)
  config.online.max_lag = -1
  with pytest.raises(ConfigError, match=r"config.online.max_lag=-1: must be a whole number >= 0"):
    validate(config, digirl.CHOICES)


def test_a_policy_lag_in_a_multi_process_run_is_refused_naming_the_key():
  config = digirl_config.get_config(None)
  config.online.max_lag, config.distributed = 1, False
  validate(config, digirl.CHOICES)
  config.distributed = True
  with pytest.raises(ConfigError, match=r"config.online.max_lag=1: .* set --config.online.max_lag=0"):
    validate(config, digirl.CHOICES)
  config.online.max_lag = 0
  validate(config, digirl.CHOICES)


@pytest.mark.parametrize("args,key", [(["--config=configs/digiq.py", "--config.critic.advantage_estimation=MC"],
                                       "critic.advantage_estimation"),
                                      (["--config=configs/digiq.py:paper"], "model.hf_checkpoint")])
@pytest.mark.slow
def test_main_refuses_a_bad_value_before_any_work(tmp_path, args, key):
  t0 = time.monotonic()
  proc = subprocess.run([sys.executable, "-m", "jaxagent.main", f"--workdir={tmp_path / 'w'}", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0 and key in proc.stderr, proc.stderr[-2000:]
  assert not os.path.exists(tmp_path / "w" / "tasks")  # nothing ran
  assert time.monotonic() - t0 < 60
