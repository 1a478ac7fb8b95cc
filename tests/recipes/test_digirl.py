"""DigiRL end to end on the `smoke` config, through real Chromium and the bundled sites.

The module fixture starts `python -m jaxagent.main --config=configs/digirl.py:smoke` in a subprocess, SIGKILLs it
once the online phase has stored its first episode (mid `online` stage, inside an iteration), then runs the
pipeline to the end in this process: the restarted run must keep that episode, run only the rest, and finish.
"""

import json
import os
import shutil

import numpy as np
import pytest

import acting
import killed_run
from configs import digirl as digirl_config
from configs import filtered_bc as filtered_bc_config
from jaxagent import types
from jaxagent.types import Observation, Step, Task, Trajectory
from jaxagent.agents import autoui
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import device
from jaxagent.pipeline.config import ConfigError, validate
from jaxagent.pipeline.stages import DONE
from jaxagent.recipes import digirl



def _config(arg="smoke"):
  return digirl_config.get_config(arg)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("digirl"))
  online = os.path.join(workdir, "online", "iter0_rollouts", "store", "episodes.jsonl")
  killed_with = killed_run.run_until("configs/digirl.py:smoke", workdir, online)
  config = _config()
  results = digirl.run(config, workdir)
  return config, workdir, results, killed_with


@pytest.mark.slow
def test_killed_online_phase_resumes_without_redoing_episodes(pipeline):
  config, workdir, _, killed_with = pipeline
  assert killed_with >= 1, "the first run was killed before the online phase stored an episode"
  store = TrajectoryStore(os.path.join(workdir, "online", "iter0_rollouts", "store"))
  ids = [store.read_json(i)["task"]["id"] for i in range(len(store))]
  assert len(ids) == config.online.episodes == len(set(ids))  # nothing lost, nothing run twice
  for stage in digirl.STAGES:
    assert os.path.exists(os.path.join(workdir, stage, DONE)), stage
  for part in ("rollouts", "critics", "actor"):
    assert os.path.exists(os.path.join(workdir, "online", f"iter0_{part}", DONE)), part


@pytest.mark.slow
def test_results_report_the_four_policies_on_the_same_held_out_episodes(pipeline):
  config, workdir, results, _ = pipeline
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert "packages" in saved.pop("provenance") and saved == results  # where it came from, then the figures
  assert list(saved) == ["il", "filtered_bc", "digirl_offline", "digirl_off2on"]
  assert {n for pair in digirl.PAIRS for n in pair} <= set(saved)  # what `--seeds` pairs is what the eval reports
  for name, r in saved.items():
    assert r["episodes"] == config.eval.episodes and r["temperature"] == config.eval.temperature
    ids = [TrajectoryStore(os.path.join(workdir, "eval", name)).read_json(i)["task"]["id"]
           for i in range(config.eval.episodes)]
    assert sorted(ids) == sorted(t.id for t in digirl.test_episodes(config, workdir))
  test_tasks = {t.id for t in device.suite(workdir, "test")}
  for store_dir in ("il/demos", "offline_data/store", "online/iter0_rollouts/store"):
    store = TrajectoryStore(os.path.join(workdir, store_dir))
    trained_on = {store.read_json(i)["task"]["id"].split("@")[0] for i in range(len(store))}
    assert trained_on and not trained_on & test_tasks, store_dir  # no evaluation task in any training data
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(workdir, "eval")))


@pytest.mark.slow
def test_a_malformed_action_ended_its_episode(pipeline):
  _, workdir, _, _ = pipeline
  store = TrajectoryStore(os.path.join(workdir, "offline_data", "store"))
  trajs = [store.read(i) for i in range(len(store))]
  malformed = 0
  for traj in trajs:
    for k, step in enumerate(traj.steps):
      try:
        autoui.autoui_translate_action(step.action_text)
      except autoui.TaskImpossibleError:
        malformed += 1
        assert k == len(traj.steps) - 1 and step.action.kind == types.ActionKind.IMPOSSIBLE
  assert malformed, "the smoke actor wrote no malformed action; the test saw nothing to check"


@pytest.mark.slow
@pytest.mark.long
def test_offline_mode_trains_on_a_given_store(pipeline, tmp_path):
  config, workdir, _, _ = pipeline
  store = str(tmp_path / "store")
  shutil.copytree(os.path.join(workdir, "offline_data", "store"), store)
  other = str(tmp_path / "run")
  shutil.copytree(os.path.join(workdir, "tasks"), os.path.join(other, "tasks"))
  shutil.copytree(os.path.join(workdir, "il"), os.path.join(other, "il"))
  config = _config()
  config.mode, config.data.path = "offline", store
  results = digirl.run(config, other)
  assert list(results) == ["il", "filtered_bc", "digirl_offline"]
  with open(os.path.join(other, "offline_data", DONE)) as f:
    assert json.load(f)["source"] == store
  assert not os.path.exists(os.path.join(other, "offline_data", "store"))
  assert not os.path.exists(os.path.join(other, "online"))


@pytest.fixture(scope="module")
def online(pipeline, tmp_path_factory):
  """The `online` mode from the pipeline's tasks and IL actor, 2 iterations with `max_lag=1`: one run serves
  the mode's test and the lag's (each was a run of its own)."""
  _, workdir, _, _ = pipeline
  other = str(tmp_path_factory.mktemp("online"))
  for stage in ("tasks", "il"):  # finished stages of the same config, reused as a rerun would
    shutil.copytree(os.path.join(workdir, stage), os.path.join(other, stage))
  config = _config()
  config.mode = "online"
  config.online.update(iterations=2, max_lag=1)
  return other, digirl.run(config, other)


def _only_online_and_its_own_stages(other, results, algorithm):
  assert os.path.exists(os.path.join(other, "online", "iter0_actor", DONE))
  assert os.path.exists(os.path.join(other, "online", "iter0_critics", DONE)) == (algorithm == "digirl")
  assert not os.path.exists(os.path.join(other, "digirl_offline"))
  return list(results)


@pytest.mark.slow
@pytest.mark.long
def test_online_mode_runs_its_own_stages(online):
  other, results = online
  assert _only_online_and_its_own_stages(other, results, "digirl") == ["il", "digirl_online"]
  assert not os.path.exists(os.path.join(other, "offline_data"))


@pytest.mark.slow
@pytest.mark.long
def test_off2on_filtered_bc_runs_its_own_stages(pipeline, tmp_path):
  _, workdir, _, _ = pipeline
  other = str(tmp_path / "run")
  for stage in ("tasks", "il", "offline_data", "critics", "filtered_bc"):  # reused as a rerun would
    shutil.copytree(os.path.join(workdir, stage), os.path.join(other, stage))
  config = _config()
  config.mode, config.algorithm = "off2on", "filtered_bc"
  results = digirl.run(config, other)
  assert _only_online_and_its_own_stages(other, results, "filtered_bc") == [
      "il", "filtered_bc", "filtered_bc_off2on"]


@pytest.mark.slow
@pytest.mark.long
def test_online_rounds_with_lag_are_collected_by_the_older_actor(online):
  other, _ = online
  rounds = [json.load(open(os.path.join(other, "online", f"iter{i}_rollouts", DONE))) for i in range(2)]
  il = os.path.join(other, "il")
  assert [(r["behaviour"], r["lag"]) for r in rounds] == [(il, 0), (il, 1)]  # round 1 ran while actor 1 trained
  stored = TrajectoryStore(os.path.join(other, "online", "iter1_rollouts", "store"))
  assert {t.meta["policy_lag"] for t in stored} == {1} and {t.meta["behaviour_actor"] for t in stored} == {il}
  assert os.path.exists(os.path.join(other, "online", "iter1_actor", DONE))


def test_llm_judge_is_digirls_per_step_evaluator(tmp_path, monkeypatch):
  monkeypatch.syspath_prepend(os.path.join(killed_run.ROOT, "tests", "judges"))
  import openai_peer  # pylint: disable=g-import-not-at-top  # the real local OpenAI-compatible server of the judge tests
  monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
  with openai_peer.Peer() as peer:
    config = _config()
    config.judge.kind = "llm"
    config.judge.llm.update(base_url=peer.base_url, model="peer", digirl_task_set="general")
    judge = digirl._judge(config, str(tmp_path))
    assert judge.config.protocol == "digirl" and judge.config.image_root == str(tmp_path)
    task = Task(id="t", intent="please succeed", site="shop", start_url="/", profile="device")
    screens = [np.full((64, 64, 3), v, np.uint8) for v in (10, 200)]
    traj = Trajectory(task, [Step(step=0, observation=Observation(url="", screenshot=screens[0]))],
                      final_observation=Observation(url="", screenshot=screens[1]))
    assert judge.evaluate(task, traj).success == 1.0
    parts = peer.state.bodies[0]["messages"][0]["content"]
    assert sum(p.get("type") == "image_url" for p in parts) == 10  # 9 general exemplars + the new screen


def test_parse_defaults_to_the_originals_rule():
  config = _config("")
  assert config.parse == "faithful"
  ends = device.PARSERS[config.parse].parse("Action Plan: [TYPE] no decision here")
  assert ends.kind == types.ActionKind.IMPOSSIBLE and ends.ends_episode
  lenient = device.PARSERS["lenient"].parse("Action Plan: [TYPE] no decision here")
  assert lenient.kind == types.ActionKind.INVALID and not lenient.ends_episode


@pytest.mark.parametrize("key,value", [("mode", "offpolicy"), ("algorithm", "ppo"), ("parse", "strict"),
                                       ("actor.advantage", "gae"), ("judge.kind", "gemini")])
def test_bad_choices_are_refused_naming_the_allowed_values(key, value):
  config = _config()
  validate(config, digirl.CHOICES, {})
  section, _, leaf = key.rpartition(".")
  (config[section] if section else config)[leaf] = value
  with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
    validate(config, digirl.CHOICES, {})
  for allowed in digirl.CHOICES[key]:
    assert allowed in str(e.value)


def test_the_replay_capacity_is_the_codes_2000_transitions():
  for config in (_config(""), _config("paper"), filtered_bc_config.get_config("")):
    assert config.capacity == 2000  # `scripts/config/main/default.yaml: capacity: 2000`
    digirl.check_config(config)


@pytest.mark.parametrize("value", [-1, 2.5, True, "2000"])
def test_a_bad_capacity_is_refused_naming_the_key(value):
  config = _config()
  config.unlock()
  del config["capacity"]
  config.capacity = value
  with pytest.raises(ConfigError, match=r"config\.capacity=.*whole number >= 0.*--config\.capacity="):
    digirl.check_config(config)


@pytest.mark.slow
def test_each_stage_draws_from_its_split(tmp_path, monkeypatch):
  """On the benchmark, demonstrations, offline data and online rounds come from train_a, train_b and train_c."""
  config = _config()
  config.tasks.update(suite="bench", templates="cart", level=0)
  config.demos.split, config.offline.split, config.online.split = "train_a", "train_b", "train_c"
  validate(config, digirl.CHOICES, {})
  digirl.check_config(config)
  device.stage_tasks(config, str(tmp_path / "tasks"))
  part = lambda tasks: {t.split for t in tasks}
  assert part(device.demo_tasks(config, str(tmp_path))) == {"train_a"}
  assert part(digirl.online_episodes(config, str(tmp_path), 0)) == {"train_c"}
  drawn = []
  monkeypatch.setattr(digirl, "_rollout", lambda config, actor, temperature, tasks, *a: drawn.extend(tasks) or [])
  digirl.stage_offline_data(config, str(tmp_path), str(tmp_path / "offline_data"))
  assert part(drawn) == {"train_b"} and len(drawn) == config.offline.episodes
  config.tasks.suite = "sites"
  with pytest.raises(ConfigError, match=r"config\.online\.split='train_c' names train_c, a part of the "
                                        r"benchmark only"):
    digirl.check_config(config)


def test_filtered_bc_config_is_digirl_with_the_baseline_algorithm():
  fbc, base = filtered_bc_config.get_config("smoke"), _config()
  assert fbc.algorithm == "filtered_bc" and base.algorithm == "digirl"
  fbc.algorithm = "digirl"
  assert fbc.to_dict() == base.to_dict()


@pytest.mark.slow
def test_the_evaluation_cli_acts_as_the_recipe_with_a_trained_actor(pipeline, tmp_path, monkeypatch):
  """`jaxagent.evaluate --policy <the online actor>` prompts it as the recipe's evaluation does (its agent.json:
  the AutoUI turn over the 1/4 screenshot, the parse rule), with the same verdicts."""
  config, workdir, _, _ = pipeline
  name = f"{config.algorithm}_{config.mode}"
  actor = digirl.policies(config, workdir)[name]
  acting.assert_cli_acts_as_the_recipe(monkeypatch, tmp_path, config,
                                       acting.recipe_evaluation_of(monkeypatch, digirl, name, workdir), name, actor,
                                       digirl.test_episodes(config, workdir))


# ------------------------------------------------------------------------------ the screen as text


def test_the_screenshot_stays_the_default_and_the_papers_path():
  for config in (_config(""), _config("paper")):
    assert config.env.observation == "screenshot" and config.model.kind == "vlm"
  with pytest.raises(ValueError, match="paper.*text=1"):
    _config("paper,text=1")


def test_the_text_observation_validates_with_a_text_decoder():
  for arg in ("text=1", "smoke,text=1"):
    config = _config(arg)
    assert (config.env.observation, config.env.browser, config.model.kind) == ("html", "text", "decoder")
    validate(config, digirl.CHOICES, {})
    digirl.check_config(config)
    assert device.actor_format(config).max_page_chars == config.data.page_chars
  config = _config("smoke,text=1")
  config.env.browser = "chromium"  # the reference renderer serves the same text
  digirl.check_config(config)


def test_a_bad_observation_is_refused_naming_the_key():
  config = _config()
  config.env.observation = "pixels"
  with pytest.raises(ConfigError, match=r"config\.env\.observation='pixels'.*screenshot.*html"):
    validate(config, digirl.CHOICES, {})


@pytest.mark.parametrize("key,value,match", [
    ("model.kind", "vlm", r"config\.model\.kind='vlm'.*--config\.model\.kind=decoder"),
    ("judge.kind", "llm", r"config\.judge\.kind='llm'.*screenshots"),
    ("env.observation", "screenshot", r"config\.model\.kind='decoder'.*--config\.env\.observation=html"),
])
def test_the_keys_the_text_observation_binds_are_checked_before_any_work(key, value, match):
  config = _config("smoke,text=1")
  section, _, leaf = key.rpartition(".")
  config[section][leaf] = value
  with pytest.raises(ConfigError, match=match):
    digirl.check_config(config)


def test_the_text_backend_with_a_screenshot_is_refused():
  config = _config("smoke")
  config.env.browser = "text"
  with pytest.raises(ConfigError, match=r"config\.env\.browser='text'.*config\.env\.observation='screenshot'"):
    digirl.check_config(config)


@pytest.mark.slow
@pytest.mark.long
def test_digirl_runs_end_to_end_on_the_screen_as_text(tmp_path):
  """`configs/digirl.py:smoke,text=1`: a text decoder through every stage on the text backend, its prompts the
  phone's page and AutoUI's goal, its samples text alone."""
  config = _config("smoke,text=1")
  workdir = str(tmp_path)
  results = digirl.run(config, workdir)
  assert set(results) == {"il", "filtered_bc", "digirl_offline", "digirl_off2on"}
  with open(os.path.join(workdir, "il", "agent.json")) as f:
    assert json.load(f)["format"] == "autoui_text"
  trajs = device.read_store(workdir, "offline_data", "store")[1]
  step = trajs[0].steps[0]
  assert step.obs_text.startswith("Screen: <html>") and "Goal: " in step.obs_text and not step.image_path
  demos = device.demo_samples(workdir, text=True)
  assert demos and all(not d["images"] and "<image>" not in d["conversations"][0]["value"] for d in demos)
  assert any("id=" in d["conversations"][1]["value"] for d in demos)  # the expert's taps name elements
  data = digirl.offline_data(config, workdir)
  assert data.screens[0].shape[1] == 0  # the critics read the page in the prompt's bag of words
