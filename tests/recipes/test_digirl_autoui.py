"""DigiRL end to end with AutoUI as the actor (`--config.model.kind=autoui`): the `smoke` config through real
Chromium and the bundled sites, every stage unchanged but the actor an encoder-decoder over a frozen encoder. A second model family of a recipe
`test_digirl.py` runs end to end: the long lane (`scripts/test.sh --lane long`)."""

import json
import os

import numpy as np
import pytest

import acting
from configs import digirl as digirl_config
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline.config import validate
from jaxagent.pipeline.stages import DONE
from jaxagent.recipes import digirl
from jaxagent.serving.checkpoint import load_policy, read_workdir_config

pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("digirl_autoui"))
  config = digirl_config.get_config("smoke")
  config.model.kind = "autoui"
  validate(config, digirl.CHOICES, {})  # what `jaxagent.main` checks before any work
  return config, workdir, digirl.run(config, workdir)


@pytest.mark.slow
def test_every_stage_runs_and_results_report_every_policy(pipeline):
  config, workdir, results = pipeline
  for stage in digirl.STAGES:
    assert os.path.exists(os.path.join(workdir, stage, DONE)), stage
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert "packages" in saved.pop("provenance") and saved == results  # where it came from, then the figures
  assert list(saved) == ["il", "filtered_bc", "digirl_offline", "digirl_off2on"]
  for name, r in saved.items():
    assert r["episodes"] == config.eval.episodes and r["errored"] == 0, name
    store = TrajectoryStore(os.path.join(workdir, "eval", name))
    assert all(store.read(i).steps for i in range(len(store))), name  # every episode took at least one step


@pytest.mark.slow
def test_the_actors_are_autoui_and_the_critics_read_its_frozen_encoder(pipeline):
  config, workdir, _ = pipeline
  for name, model_dir in digirl.policies(config, workdir).items():  # a stage that kept no sample names its start
    assert read_workdir_config(os.path.join(model_dir, "config.json")).model.kind == "autoui", name
  assert os.path.isdir(os.path.join(workdir, "filtered_bc", "checkpoints"))  # an actor trained from the IL AutoUI
  loaded = load_policy(os.path.join(workdir, "il"))
  assert loaded.kind == "autoui"
  with np.load(os.path.join(workdir, "critics", "feats.npz")) as f:
    feats = f["0"]
  assert feats.shape[-1] == loaded.model.config.img_dim  # the pooled frozen-encoder feature, as BLIP-2's for DigiRL
  store = TrajectoryStore(os.path.join(workdir, "offline_data", "store"))
  actions = [s.action_text for i in range(len(store)) for s in store.read(i).steps]
  assert actions and all(isinstance(a, str) for a in actions)  # the IL AutoUI acted in the offline rollouts


@pytest.mark.slow
def test_the_evaluation_cli_acts_as_the_recipe_with_a_trained_actor(pipeline, tmp_path, monkeypatch):
  """`jaxagent.evaluate --policy <the online actor>` prompts it as the recipe's evaluation does (its agent.json:
  the AutoUI turn over the 1/4 screenshot, the parse rule), with the same verdicts."""
  config, workdir, _ = pipeline
  name = f"{config.algorithm}_{config.mode}"
  actor = digirl.policies(config, workdir)[name]
  acting.assert_cli_acts_as_the_recipe(monkeypatch, tmp_path, config,
                                       acting.recipe_evaluation_of(monkeypatch, digirl, name, workdir), name, actor,
                                       digirl.test_episodes(config, workdir))
