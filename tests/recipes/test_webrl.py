"""WebRL end to end on the `smoke` config, through real Chromium and the bundled sites.

The module fixture starts `python -m jaxagent.main --config=configs/webrl.py:smoke` in a subprocess, SIGKILLs it
once phase 1's rollouts have stored their first episode (mid phase), then runs the pipeline to the end in this
process: the restarted run must keep that episode, run only the rest, and finish.
"""

import json
import os
import shutil
import types

import pytest

import acting
import killed_run
from configs import webrl as webrl_config
from jaxagent.agents.webrl import WebRL
from jaxagent.data import tokenizer as tokenizer_lib
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import device
from jaxagent.pipeline.config import ConfigError, validate
from jaxagent.pipeline.stages import DONE
from jaxagent.recipes import webrl
from jaxagent.types import Action, Step


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("webrl"))
  marker = os.path.join(workdir, "phase1", "rollouts", "store", "episodes.jsonl")
  killed_with = killed_run.run_until("configs/webrl.py:smoke", workdir, marker)
  config = webrl_config.get_config("smoke")
  results = webrl.run(config, workdir)
  return config, workdir, results, killed_with


def _ids(store_dir):
  store = TrajectoryStore(store_dir)
  return [store.read_json(i)["task"]["id"] for i in range(len(store))]


@pytest.mark.slow
def test_killed_phase_resumes_without_redoing_episodes(pipeline):
  config, workdir, _, killed_with = pipeline
  assert killed_with >= 1, "the first run was killed before phase 1 stored an episode"
  ids = _ids(os.path.join(workdir, "phase1", "rollouts", "store"))
  assert len(ids) == config.curriculum.tasks == len(set(ids))  # nothing lost, nothing run twice
  for stage in ("tasks", "sft", "orm", "eval"):
    assert os.path.exists(os.path.join(workdir, stage, DONE)), stage
  for phase in ("phase1", "phase2"):
    for part in ("curriculum", "rollouts", "labels", "critic", "actor"):
      assert os.path.exists(os.path.join(workdir, phase, part, DONE)), (phase, part)
  with open(os.path.join(workdir, "phase2", "curriculum", DONE)) as f:
    assert "passed_filter" in json.load(f)  # phase 2 filtered its candidates with phase 1's critic


@pytest.mark.slow
def test_results_compare_sft_and_each_phase_on_the_same_held_out_episodes(pipeline):
  config, workdir, results, _ = pipeline
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert "packages" in saved.pop("provenance") and saved == results  # where it came from, then the figures
  assert list(saved) == ["sft", "phase1", "phase2"]
  episodes = sorted(t.id for t in webrl.test_episodes(config, workdir))
  for name, r in saved.items():
    assert r["episodes"] == config.eval.episodes and r["temperature"] == config.eval.temperature
    assert sorted(_ids(os.path.join(workdir, "eval", name))) == episodes
  test = device.suite(workdir, "test")
  test_ids, test_intents = {t.id for t in test}, {t.intent for t in test}
  for store_dir in ("sft/demos", "orm/store", "orm/near_misses", "phase1/rollouts/store", "phase2/rollouts/store"):
    store = TrajectoryStore(os.path.join(workdir, store_dir))
    trajs = [store.read(i) for i in range(len(store))]
    assert trajs, store_dir
    assert not {t.task.id.split("@")[0] for t in trajs} & test_ids, store_dir
    assert not {t.task.intent for t in trajs} & test_intents, store_dir  # no evaluation intent trained on
  with open(os.path.join(workdir, "orm_agreement.json")) as f:
    agreement = json.load(f)
  assert len(agreement["orm_by_phase"]) == config.phases
  assert agreement["orm_by_phase"][0]["episodes"] == config.curriculum.tasks


@pytest.mark.slow
def test_the_actor_trains_on_webrl_prompts_and_the_orm_labels_every_episode(pipeline):
  _, workdir, _, _ = pipeline
  with open(os.path.join(workdir, "phase1", "labels", "orm.json")) as f:
    labels = json.load(f)
  ids = _ids(os.path.join(workdir, "phase1", "rollouts", "store"))
  assert set(labels) == set(ids) and all(0.0 <= p <= 1.0 for p in labels.values())
  store = TrajectoryStore(os.path.join(workdir, "phase1", "rollouts", "store"))
  step = store.read(0).steps[0]
  assert step.obs_text.startswith("Task Instruction: ") and "data-bbox" not in step.obs_text  # html=compact
  with open(os.path.join(workdir, "phase1", "actor", "DONE")) as f:
    actor = json.load(f)
  assert actor["phase_steps"] == sum(len(store.read(i).steps) for i in range(len(store)))


@pytest.mark.slow
def test_every_model_keeps_the_tokenizer_fitted_on_the_demonstrations(pipeline):
  _, workdir, _, _ = pipeline
  fitted = os.path.join(workdir, "sft", "fitted_tokenizer", "tokenizer.json")
  with open(fitted) as f:
    vocab = json.load(f)["model"]["vocab"]
  assert vocab != json.load(open(os.path.join(tokenizer_lib.default_tokenizer_dir(), "tokenizer.json")))["model"]["vocab"]
  for model in ("sft", "orm/model", "phase1/actor", "phase2/actor"):  # the ORM and actors start from π_0's weights
    with open(os.path.join(workdir, model, "tokenizer", "tokenizer.json")) as f:
      assert json.load(f)["model"]["vocab"] == vocab, model


def test_a_fitted_tokenizer_with_a_pretrained_checkpoint_is_refused():
  config = webrl_config.get_config("smollm")
  webrl.check_config(config)
  config.data.tokenizer = "demos"
  with pytest.raises(ConfigError, match=r"config\.data\.tokenizer='demos'.*--config\.data\.tokenizer=''"):
    webrl.check_config(config)


@pytest.mark.slow
@pytest.mark.long
def test_with_lag_the_next_phase_collects_while_the_actor_trains(pipeline, tmp_path):
  _, workdir, _, _ = pipeline
  other = str(tmp_path / "lagged")
  for stage in ("tasks", "sft", "orm"):
    shutil.copytree(os.path.join(workdir, stage), os.path.join(other, stage))
  config = webrl_config.get_config("smoke")
  config.rollout.max_lag = 1
  webrl.run(config, other)
  rounds = [json.load(open(os.path.join(other, f"phase{t}", "rollouts", DONE))) for t in (1, 2)]
  sft = os.path.join(other, "sft")
  assert [(r["behaviour"], r["lag"]) for r in rounds] == [(sft, 0), (sft, 1)]  # phase 2 by π_0, while π_1 trained
  stored = TrajectoryStore(os.path.join(other, "phase2", "rollouts", "store"))
  assert {t.meta["policy_lag"] for t in stored} == {1}
  # phase 2's tasks still came from phase 1's failures through phase 1's critic (gated on them, not on π_1)
  assert json.load(open(os.path.join(other, "phase2", "curriculum", DONE)))["failed_seeds"] == len(
      [1 for line in open(os.path.join(other, "phase1", "labels", "failed.jsonl")) if line.strip()])
  assert os.path.exists(os.path.join(other, "eval", DONE))


@pytest.mark.parametrize("key,value", [("actor.loss", "ppo"), ("html", "raw"), ("reward", "gpt4"),
                                       ("model.kind", "vlm"), ("curriculum.generator", "gpt4o"),
                                       ("actor.normalize", "token"), ("orm.page", "cut")])
def test_bad_choices_are_refused_naming_the_allowed_values(key, value):
  config = webrl_config.get_config()
  validate(config, webrl.CHOICES, {})
  config.unlock()
  section, _, leaf = key.rpartition(".")
  (config[section] if section else config)[leaf] = value
  with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
    validate(config, webrl.CHOICES, {})


@pytest.mark.parametrize("key,value", [("early_stop.parse_failures", -1), ("early_stop.repeats", -2)])
def test_a_bad_early_stop_threshold_is_refused_naming_the_key(key, value):
  config = webrl_config.get_config()
  section, leaf = key.split(".")
  config[section][leaf] = value
  with pytest.raises(ConfigError, match=rf"config\.{section}\.{leaf}={value!r}: must be a whole number >= 0"):
    validate(config, webrl.CHOICES, {})


def test_every_policy_rollout_ends_by_the_configured_early_stop(monkeypatch):
  """The thresholds are the actors' format options (so `agent.json` carries them to any loader), and every
  policy rollout (the ORM data's, the phases' and, through `evaluate_actors`, the evaluation's) ends by them."""
  config = webrl_config.get_config()
  fmt = webrl.agent_format(config)
  assert (fmt.stop_parse_failures, fmt.stop_repeats) == (5, 5)
  seen = []
  monkeypatch.setattr(webrl, "load_actor", lambda *args: types.SimpleNamespace(fmt=fmt))
  monkeypatch.setattr(webrl.device, "rollout", lambda *args, **kwargs: seen.append(kwargs["early_stop"]) or [])
  webrl._rollout(config, "sft", 0.0, [], "store", "sft", 0)
  invalid = Step(step=0, action_text="x", action=Action.invalid("no"))
  assert seen[0]([invalid] * 5) == "Failed to parse actions for 5 times" and seen[0]([invalid] * 4) == ""
  config.early_stop.update(parse_failures=0, repeats=3)
  assert webrl.agent_format(config).early_stop([invalid] * 3) == "Same action for 3 times"
  config.early_stop.repeats = 0
  assert webrl.agent_format(config).early_stop([invalid] * 9) == ""


def test_compact_html_keeps_the_ids_the_actions_name():
  from jaxagent.types import Observation
  html = '<a id="3" href="/s/0123456789abcdef/shop/c/audio" data-bbox="88,51,43,21"> Audio </a>'
  obs = Observation(url="", html=html, intent="Open audio")
  full, compact = WebRL().build_prompt("Open audio", obs, []), WebRL(compact=True).build_prompt("Open audio", obs, [])
  assert html in full
  assert '<a id="3"> Audio </a>' in compact


@pytest.mark.parametrize("stage", ["sft", "orm"])
@pytest.mark.parametrize("key,value", [("steps", -1), ("prompt_chars", 0)])
def test_a_bad_warmup_value_is_refused_naming_the_key(stage, key, value):
  config = webrl_config.get_config()
  config[stage].warmup[key] = value
  with pytest.raises(ConfigError, match=rf"config\.{stage}\.warmup\.{key}="):
    webrl.check_config(config)


@pytest.mark.parametrize("value", [0, -1, True])
def test_a_bad_replay_chunks_is_refused_naming_the_key(value):
  config = webrl_config.get_config()
  webrl.check_config(config)
  config.replay.chunks = value
  with pytest.raises(ConfigError, match=rf"config\.replay\.chunks={value!r}: must be a whole number >= 1"):
    webrl.check_config(config)


def test_bench_puts_another_variant_on_the_benchmark():
  both, bench, smollm = (webrl_config.get_config(a) for a in ("smollm,bench=1", "bench", "smollm"))
  assert both.model.hf_checkpoint == "smollm2" and both.sft.optim.lr == smollm.sft.optim.lr
  assert (both.tasks.suite, both.demos.split, both.prompt_chars) == ("bench", "train_a", bench.prompt_chars)
  webrl.check_config(both)
  with pytest.raises(ValueError, match="unknown variant 'bnech'"):
    webrl_config.get_config("bnech")


@pytest.mark.parametrize("value", [-1, True])
def test_a_bad_copy_count_is_refused_naming_the_key(value):
  config = webrl_config.get_config()
  config.sft.augment.copies = 2
  webrl.check_config(config)
  config.sft.augment.copies = value
  with pytest.raises(ConfigError, match=rf"config\.sft\.augment\.copies={value!r}: must be a whole number >= 0"):
    webrl.check_config(config)


def test_the_defaults_are_the_originals():
  """The actor's log-ratio per sample, the replay's 8 chunks, the ORM's whole final page (docs/results/webrl.md);
  the demonstrations as recorded (no swapped copies)."""
  config = webrl_config.get_config()
  assert (config.actor.normalize, config.replay.chunks, config.orm.page) == ("sample", 8, "full")
  assert config.sft.augment.copies == 0 and webrl_config.get_config("bench").sft.augment.copies == 0


def test_a_non_positive_actor_epochs_is_refused():
  config = webrl_config.get_config()
  config.actor.epochs = 0.0
  with pytest.raises(ConfigError, match=r"config\.actor\.epochs=0\.0"):
    webrl.check_config(config)


@pytest.mark.slow
def test_the_evaluation_cli_acts_as_the_recipe_with_a_trained_actor(pipeline, tmp_path, monkeypatch):
  """`jaxagent.evaluate --policy <phase 2's actor>` prompts it as the recipe's evaluation does (its agent.json:
  compact HTML, the prompt cut, the chat template, VAB's early stop), with the same verdicts."""
  config, workdir, _, _ = pipeline
  actor = webrl.phase_actor(workdir, int(config.phases))
  acting.assert_cli_acts_as_the_recipe(monkeypatch, tmp_path, config,
                                       acting.recipe_evaluation_of(monkeypatch, webrl, f"phase{config.phases}", workdir),
                                       f"phase{config.phases}", actor, webrl.test_episodes(config, workdir))


@pytest.mark.slow
def test_each_stage_draws_from_its_split(tmp_path, monkeypatch):
  """On the benchmark (text profile): demonstrations from train_a, the ORM's episodes from train_b, the
  curriculum's variations from train_c; train_c is refused off the benchmark, naming the key."""
  from jaxagent.pipeline import tasks as tasks_lib  # pylint: disable=g-import-not-at-top
  from jaxagent.proj.webrl import curriculum  # pylint: disable=g-import-not-at-top
  config = webrl_config.get_config()
  config.tasks.update(suite="bench", templates="cart", level=0)
  config.demos.split, config.orm.split, config.curriculum.split = "train_a", "train_b", "train_c"
  validate(config, webrl.CHOICES, {})
  webrl.check_config(config)
  tasks_lib.stage_tasks(config, str(tmp_path / "tasks"), "text")
  failed = tasks_lib.read_tasks(str(tmp_path / "tasks" / "train_a.jsonl"))[:3]
  os.makedirs(tmp_path / "phase1" / "labels")
  tasks_lib.write_tasks(str(tmp_path / "phase1" / "labels" / "failed.jsonl"), failed)
  found, _ = curriculum.candidates(config, str(tmp_path), 2, 6, str(tmp_path / "out"))
  assert found and {t.split for t in found} == {"train_c"}
  drawn = []
  monkeypatch.setattr(webrl, "_rollout", lambda config, actor, temperature, tasks, *a: drawn.extend(tasks) or [])
  monkeypatch.setattr(webrl.device, "rollout", lambda config, spec, policy, tasks, *a, **k: drawn.extend(tasks) or [])
  webrl.orm_episodes(config, str(tmp_path), str(tmp_path / "orm"))
  assert {t.split for t in drawn} == {"train_b"} and len(drawn) == config.orm.episodes + config.orm.near_misses
  config.tasks.suite = "sites"
  with pytest.raises(ConfigError, match=r"config\.curriculum\.split='train_c' names train_c, a part of the "
                                        r"benchmark only"):
    webrl.check_config(config)



@pytest.mark.slow
@pytest.mark.long
def test_the_bench_prompt_shows_every_element_the_expert_acts_on():
  """Every element the expert clicks or types into on the benchmark's headline is in the bench variant's prompt
  (a policy cannot name an id it is not shown), which the default's cut is not."""
  from data_tools import observability  # pylint: disable=g-import-not-at-top
  config = webrl_config.get_config("bench")
  total = observability.measure(config)["total"]
  assert total["intents"] == total["expert_successes"] >= 200
  assert total["shown"] == total["element_steps"] > 0 and total["intents_every_element_shown"] == total["intents"]
  config.prompt_chars = webrl_config.get_config().prompt_chars
  assert observability.measure(config)["total"]["shown"] < total["element_steps"]


@pytest.mark.slow
@pytest.mark.long
def test_the_smollm_variant_runs_end_to_end_on_a_two_layer_cut(smollm2_cut, tmp_path):
  """`configs/webrl.py:smollm` (SmolLM2's tokenizer and chat template for the policy, ORM and critic trunk) with
  SmolLM2 cut to two layers and a smoke's budget: SFT, ORM, one phase of curriculum → critic → actor, evaluation."""
  config = webrl_config.get_config("smollm")
  config.model.hf_checkpoint = smollm2_cut
  config.data.seq_len = 2048  # its samples at the default cut fit (~1,100 tokens); the variant's 4,096 cost ~2x here
  config.env.workers = 2
  config.sampling.max_tokens = 16
  config.demos.episodes = 2
  for block in (config.sft, config.orm, config.critic, config.actor):
    block.train.update(steps=1, batch_size=2)
  config.orm.update(episodes=2, near_misses=1)
  config.phases = 1
  config.curriculum.tasks = 2
  config.eval.episodes = 1
  config.train.progress_bar = False
  validate(config, webrl.CHOICES, getattr(webrl, "LISTS", {}))
  results = webrl.run(config, str(tmp_path))
  assert {"sft", "phase1"} <= set(results) and all(r["episodes"] == 1 for r in results.values()
                                                   if isinstance(r, dict) and "episodes" in r)
