"""Digi-Q end to end on the `smoke` config, through real Chromium and the bundled sites.

The module fixture starts `python -m jaxagent.main --config=configs/digiq.py:smoke` in a subprocess, SIGKILLs
it once the first expert demonstration is committed (mid `il` stage), then runs the pipeline to the end in
this process: the restarted run must keep the stored episode, run only the rest, and finish every stage.
"""

import json
import os

import numpy as np
import pytest

import killed_run
from configs import digiq as digiq_config
from jaxagent.agents import autoui
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import device
from jaxagent.pipeline.config import ConfigError, validate
from jaxagent.pipeline.stages import DONE
from jaxagent.pipeline.tasks import draw_episodes
from jaxagent.proj.digiq import critic as critic_lib
from jaxagent.proj.digiq import data as data_lib
from jaxagent.recipes import digiq

@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("digiq"))
  demos = os.path.join(workdir, "il", "demos", "episodes.jsonl")
  killed_with = killed_run.run_until("configs/digiq.py:smoke", workdir, demos)
  config = digiq_config.get_config("smoke")
  results = digiq.run(config, workdir)
  return config, workdir, results, killed_with


@pytest.mark.slow
def test_killed_run_resumes_without_redoing_episodes(pipeline):
  config, workdir, _, killed_with = pipeline
  assert killed_with >= 1, "the first run was killed before any demonstration was stored"
  store = TrajectoryStore(os.path.join(workdir, "il", "demos"))
  ids = [store.read_json(i)["task"]["id"] for i in range(len(store))]
  assert len(ids) == config.demos.episodes == len(set(ids))  # nothing lost, nothing run twice
  for stage in digiq.STAGES:
    assert os.path.exists(os.path.join(workdir, stage, DONE)), stage


@pytest.mark.slow
def test_results_cover_the_four_policies_on_held_out_episodes(pipeline):
  config, workdir, results, _ = pipeline
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert "packages" in saved.pop("provenance") and saved == results  # where it came from, then the figures
  assert {n for pair in digiq.PAIRS for n in pair} <= set(saved)  # what `--seeds` pairs is what the eval reports
  for name in ("behaviour", "il_actor", "filtered_bc_actor", "digiq_actor"):
    assert saved[name]["episodes"] == config.eval.episodes
    assert 0.0 <= saved[name]["success_rate"] <= 1.0
  # The behaviour data are train_b episodes, so the behaviour policy is evaluated afresh on the test episodes.
  assert "rollouts" not in saved["behaviour"] and os.path.isdir(os.path.join(workdir, "eval", "behaviour"))
  assert saved["held_out"] is True
  assert saved["digiq_minus_il"] == pytest.approx(
      saved["digiq_actor"]["success_rate"] - saved["il_actor"]["success_rate"])
  assert saved["digiq_minus_filtered_bc"] == pytest.approx(
      saved["digiq_actor"]["success_rate"] - saved["filtered_bc_actor"]["success_rate"])
  assert os.path.exists(os.path.join(workdir, "filtered_bc", "checkpoints"))
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(workdir, "eval")))


@pytest.mark.slow
def test_candidates_representations_and_scores_line_up(pipeline):
  config, workdir, _, _ = pipeline
  store = TrajectoryStore(os.path.join(workdir, "candidates", "store"))
  trajs = [store.read(i) for i in range(len(store))]
  steps = [s for t in trajs for s in t.steps if s.candidates]
  assert steps and all(len(s.candidates) == config.candidates.n and s.candidates[0] == s.action_text
                       for s in steps)
  reps = np.load(os.path.join(workdir, "representation", "reps.npz"))
  assert reps["reps"].shape[:2] == (len(steps), config.candidates.n) and np.isfinite(reps["reps"]).all()
  assert reps["image"].shape == reps["next_image"].shape == (len(steps), reps["reps"].shape[-1])
  scores = np.load(os.path.join(workdir, "critic", "scores.npz"))
  assert scores["q"].shape == (len(steps), config.candidates.n, 2) and scores["v"].shape == (len(steps), 2)
  assert np.array_equal(scores["valid"][:, 0], [autoui.is_action_valid(s.candidates[0]) for s in steps])
  with open(os.path.join(workdir, "viewer.html"), encoding="utf-8") as f:
    page = f.read()
  assert "data:image/png;base64," in page and "(dataset)" in page and "Q1" in page


def test_behaviour_splits_are_checked_before_any_work():
  config = digiq_config.get_config("smoke")
  for splits in ("test", "train,test", "train", "train_b", "train_a,train_b"):
    config.behaviour.splits = splits
    validate(config, digiq.CHOICES, digiq.LISTS)
  config.behaviour.splits = "train,valid"
  with pytest.raises(ConfigError, match="behaviour.splits"):
    validate(config, digiq.CHOICES, digiq.LISTS)


def test_behaviour_episodes_come_from_the_named_splits(tmp_path):
  config = digiq_config.get_config("smoke")
  config.behaviour.episodes = 24
  workdir = str(tmp_path)
  device.stage_tasks(config, os.path.join(workdir, "tasks"))
  splits = {name: {t.id for t in device.suite(workdir, name)} for name in ("train", "test", "train_b")}
  base = lambda: {t.id.split("@")[0] for t in digiq.behaviour_episodes(config, workdir)}
  assert base() == splits["train_b"]  # the default
  config.behaviour.splits = "test"
  assert base() == splits["test"]
  config.behaviour.splits = "train"
  assert base() == splits["train"]
  config.behaviour.splits = "train,test"
  assert base() <= splits["train"] | splits["test"] and base() & splits["train"] and base() & splits["test"]


def test_behaviour_episodes_on_the_test_split_are_the_evaluations(tmp_path):
  config = digiq_config.get_config("smoke")
  config.eval.episodes, config.behaviour.episodes = 5, 7
  config.behaviour.splits = "test"
  workdir = str(tmp_path)
  device.stage_tasks(config, os.path.join(workdir, "tasks"))
  evaluation = [t.id for t in digiq.test_episodes(config, workdir)]
  assert [t.id for t in digiq.behaviour_episodes(config, workdir)][:5] == evaluation  # the same draw, and more
  config.behaviour.splits = "train,test"
  assert not set(evaluation) & {t.id for t in digiq.behaviour_episodes(config, workdir)}


def test_the_default_evaluates_on_intents_in_no_training_data(tmp_path):
  """The protocol's rule on the default config: no evaluation intent in the demonstrations or the behaviour data
  (every later stage trains on those), checked on the drawn episodes themselves; `held_out` says so in the
  results, and says the opposite for the earlier default (behaviour on the test split)."""
  config = digiq_config.get_config()
  workdir = str(tmp_path)
  device.stage_tasks(config, os.path.join(workdir, "tasks"))
  demos = draw_episodes(device.suite(workdir, config.demos.split), config.demos.episodes, config.seed, "demo")
  behaviour = digiq.behaviour_episodes(config, workdir)
  evaluation = digiq.test_episodes(config, workdir)
  test_intents = [t.intent for t in device.suite(workdir, "test")]
  assert sorted(t.intent for t in evaluation) == sorted(test_intents)  # each held-out intent once
  assert len(behaviour) == config.behaviour.episodes
  train_intents = {t.intent for t in demos} | {t.intent for t in behaviour}
  assert not {t.intent for t in evaluation} & train_intents
  config.demos.split = "train_a"  # part b undemonstrated: still held out
  assert digiq.held_out(config, workdir)
  assert digiq.held_out(config, workdir)
  config.behaviour.splits = "test"
  assert not digiq.held_out(config, workdir)


def test_eval_reuses_behaviour_rollouts_only_when_they_cover_every_episode(tmp_path):
  from jaxagent import types
  config = digiq_config.get_config("smoke")
  config.eval.episodes = 3
  config.behaviour.splits = "test"
  workdir = str(tmp_path)
  device.stage_tasks(config, os.path.join(workdir, "tasks"))
  episodes = digiq.test_episodes(config, workdir)
  store = TrajectoryStore(os.path.join(workdir, "behaviour", "store"))
  for task, success in zip(reversed(episodes[1:]), (1.0, 0.0)):  # stored out of order, one missing
    store.append(types.Trajectory(task, steps=[], success=success))
  assert digiq.behaviour_rollouts(config, workdir) is None
  store.append(types.Trajectory(episodes[0], steps=[], success=1.0))
  store.refresh()
  reused = digiq.behaviour_rollouts(config, workdir)
  assert [t.task.id for t in reused] == [t.id for t in episodes]
  assert [t.success for t in reused] == [1.0, 0.0, 1.0]


def test_best_of_n_picks_the_best_valid_candidate_and_refuses_infinite_awr_weights():
  config = digiq_config.get_config("smoke")
  config.actor.update(head_reduce="min", threshold=0.1)
  q = np.array([[[0.2, 0.3], [0.9, 0.8], [1.0, 1.0]]])  # [states, N, heads]; candidate 2 is invalid
  scores = {"q": q, "v": np.array([[0.3, 0.4]]), "valid": np.array([[True, True, False]])}
  idx, adv, weight = critic_lib.best_of_n(config.actor, scores)
  assert idx.tolist() == [1] and adv.tolist() == pytest.approx([0.8 - 0.3]) and weight.tolist() == [1.0]
  config.actor.update(loss="awr", awr_beta=0.005)  # exp(0.5 / 0.005) = e^100 > float32's max
  with pytest.raises(ValueError, match="actor.awr_beta"):
    critic_lib.best_of_n(config.actor, scores)


class _ScriptedSampler:
  """A stand-in for the VLM actor's `generate` (returns queued texts; no model), to test the resampling rule."""

  def __init__(self, texts):
    self.texts, self.calls = list(texts), []

  def generate_turns(self, prompts, images, temperature=None):
    self.calls.append(len(prompts))
    return [self.texts.pop(0) for _ in prompts]


def test_invalid_candidates_are_resampled_up_to_the_limit():
  valid = ('Action Plan: [PRESS_BACK] ; Action Decision: "action_type": "PRESS_BACK", "touch_point": '
           '"[-1.0, -1.0]", "lift_point": "[-1.0, -1.0]", "typed_text": ""')
  assert autoui.is_action_valid(valid)
  sampler = _ScriptedSampler([valid, "junk1", "junk2", "junk3", "junk4"])
  out = data_lib.sample_candidates(sampler, ["p"], [None], n=3, temperature=1.2, resample=3)
  assert out == [[valid, "junk4"]] and sampler.calls == [2, 1, 1, 1]


_TAP = ('Action Plan: [DUAL_POINT] ; Action Decision: "action_type": "DUAL_POINT", "touch_point": "[{y}, {x}]", '
        '"lift_point": "[{y}, {x}]", "typed_text": ""')


@pytest.mark.slow
def test_encoder_separates_actions_and_ignores_batch_padding():
  from jaxagent.proj.digiq import represent
  from jaxagent.serving.checkpoint import random_policy
  enc = represent.Encoder(random_policy("vlm", seed=0, image_size=32), batch=4)
  screen = np.full((915, 412, 3), 240, np.uint8)
  screen[100:200] = (30, 90, 200)
  taps = [_TAP.format(y=0.1, x=0.5), _TAP.format(y=0.8, x=0.2)]
  back = taps[1].replace("DUAL_POINT", "PRESS_BACK")
  reps = enc.pairs([screen] * 5, taps + [back, taps[0], taps[0]])
  assert reps.shape == (5, enc.dim) and np.isfinite(reps).all()
  assert not np.allclose(reps[0], reps[1]) and not np.allclose(reps[1], reps[2])  # cursor / prompt differ
  np.testing.assert_allclose(reps[3], reps[0], atol=1e-5)  # same pair, other row
  np.testing.assert_allclose(reps[4], reps[0], atol=1e-5)  # same pair, alone in a padded batch
  feats = enc.images([screen, np.zeros_like(screen)])
  assert feats.shape == (2, enc.dim) and not np.allclose(feats[0], feats[1])


@pytest.mark.slow
@pytest.mark.long
def test_seeds_tool_reruns_critic_actor_and_eval_on_the_same_data(pipeline, tmp_path):
  """`data_tools/digiq_seeds.py` on the smoke run: a second seed, the demonstrations-only and the Filtered BC
  controls each evaluate a new actor on the same test episodes, linking (not copying) the data stages."""
  from data_tools import digiq_seeds  # pylint: disable=g-import-not-at-top
  config, workdir, results, _ = pipeline
  for control in ("none", "demos", "filtered_bc"):
    out = tmp_path / control
    assert digiq_seeds.main(["--workdir", workdir, "--out", str(out), "--seeds", "1",
                             "--config", "configs/digiq.py:smoke", "--control", control]) == 0
    with open(out / "results.json") as f:
      report = json.load(f)
    run = report["seeds"]["1"]
    assert run["eval"]["episodes"] == config.eval.episodes == results["digiq_actor"]["episodes"]
    assert report["mean_success_rate"] == run["eval"]["success_rate"]
    assert os.path.islink(out / "seed1" / "candidates")
    assert ("critic" in run) == (control == "none")
    assert os.path.exists(out / "seed1" / "actor" / "checkpoints")
    if control == "filtered_bc":  # every step of the successful behaviour trajectories, with the demonstrations
      store = TrajectoryStore(os.path.join(workdir, "candidates", "store"))
      wins = sum(1 for t in (store.read(i) for i in range(len(store))) if t.success == 1.0 for s in t.steps
                 if s.image_path)
      assert run["actor"]["filtered_bc_samples"] == wins
      assert run["actor"]["il_samples"] > 0


def test_train_c_is_the_benchmarks_alone_naming_the_key():
  from jaxagent.recipes import digiq  # pylint: disable=g-import-not-at-top
  config = digiq_config.get_config()
  config.behaviour.splits = "train_b,train_c"
  with pytest.raises(ConfigError, match=r"config\.behaviour\.splits='train_b,train_c' names train_c, a part of the "
                                        r"benchmark only"):
    digiq.check_config(config)
  config.tasks.update(suite="bench", templates="cart")
  config.demos.split = "train_a"
  validate(config, digiq.CHOICES, digiq.LISTS)
  digiq.check_config(config)
  config.tasks.suite = "sites"
  config.behaviour.splits, config.demos.split = "train_b", "train_c"
  with pytest.raises(ConfigError, match=r"config\.demos\.split='train_c' names train_c, a part of the benchmark only"):
    digiq.check_config(config)


def test_the_text_observation_is_refused_naming_the_key():
  """Digi-Q's representation answers whether an action changes the screen's pixels: the screenshot only."""
  config = digiq_config.get_config("smoke")
  assert config.env.observation == "screenshot"
  digiq.check_config(config)
  config.env.observation = "html"
  with pytest.raises(ConfigError, match=r"config\.env\.observation='html'.*--config\.env\.observation=screenshot"):
    digiq.check_config(config)
