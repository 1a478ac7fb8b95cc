"""GRPO end to end on the `smoke` config: MiniWoB++ in real Chromium, the solvers' IL start, two rounds of group
rollouts with weights in memory, the evaluation; then a run killed after round 1's checkpoint resumes there."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from configs import grpo as grpo_config
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import rollout
from jaxagent.pipeline.config import ConfigError
from jaxagent.pipeline.policy import load
from jaxagent.pipeline.stages import DONE
from jaxagent.proj.grpo import groups
from jaxagent.recipes import grpo

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("grpo"))
  config = grpo_config.get_config("smoke")
  results = grpo.run(config, workdir)
  return config, workdir, results


def _round(workdir, r):
  return rollout.episodes(TrajectoryStore(os.path.join(workdir, "grpo", "rounds", f"round{r}")))


@pytest.mark.slow
def test_groups_share_their_reset_and_steps_carry_their_sampled_tokens(pipeline):
  config, workdir, _ = pipeline
  g = config.grpo
  for r in (1, 2):
    trajs = _round(workdir, r)
    assert len(trajs) == g.tasks_per_round * g.group_size
    by_group = {}
    for t in trajs:
      by_group.setdefault(groups.group_of(t.task.id), []).append(t)
    assert len(by_group) == g.tasks_per_round and all(len(v) == g.group_size for v in by_group.values())
    store = TrajectoryStore(os.path.join(workdir, "grpo", "rounds", f"round{r}"))
    for members in by_group.values():  # identical resets: the same first prompt, screen and MiniWoB instance
      assert len({m.steps[0].obs_text for m in members if m.steps}) == 1
      assert len({m.task.seed for m in members}) == 1
      screens = [store.load_image(m.steps[0].image_path) for m in members]
      assert all(np.array_equal(screens[0], x) for x in screens[1:])
    steps = [s for t in trajs for s in t.steps]
    assert steps and all(s.prompt_ids and s.reply_ids and len(s.reply_logprobs) == len(s.reply_ids) for s in steps)
  with open(os.path.join(workdir, "grpo", "rounds.json")) as f:
    log = json.load(f)
  assert [m["round"] for m in log] == [1, 2] and all(m["identical_resets"] == 1.0 for m in log)


@pytest.mark.slow
def test_the_actor_is_trained_loadable_and_evaluated_beside_its_start(pipeline):
  config, workdir, results = pipeline
  n_test = len(grpo.task_names(config)) * config.tasks.test_seeds
  assert set(results) == {"il", "grpo"} and all(r["episodes"] == n_test for r in results.values())
  il = load(os.path.join(workdir, "il"), temperature=0.0)
  actor = load(os.path.join(workdir, "grpo", "actor"), temperature=0.0)
  assert actor.fmt.name == "webrl"
  moved = [float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(nnx.state(il.loaded.model, nnx.Param)),
                                                        jax.tree.leaves(nnx.state(actor.loaded.model, nnx.Param)))]
  assert max(moved) > 0  # the updates reached the saved actor


@pytest.mark.slow
def test_a_run_killed_after_round_one_resumes_from_its_checkpoint(pipeline):
  config, workdir, _ = pipeline
  ckpts = os.path.join(workdir, "grpo", "actor", "checkpoints")
  assert sorted(os.listdir(ckpts)) == ["1", "2"]
  store = lambda: len(TrajectoryStore(os.path.join(workdir, "grpo", "rounds", "round2")))  # noqa: E731  (records)
  before = store()
  shutil.rmtree(os.path.join(ckpts, "2"))
  for stage in ("grpo", "eval"):
    os.remove(os.path.join(workdir, stage, DONE))
  grpo.run(config, workdir)
  assert sorted(os.listdir(ckpts)) == ["1", "2"]
  assert store() == before  # round 2's stored episodes were replayed, not run again


def test_episodes_end_by_the_step_limit_unless_the_page_clock_is_asked_for():
  """The recipe's demonstrations, rounds and evaluation run MiniWoB++ without the page's wall-clock limit, so a
  reward does not depend on the machine's speed (`tests/envs/test_miniwob.py` plays both)."""
  config = grpo_config.get_config("smoke")
  assert grpo.env_spec(config)["episode_max_time_ms"] == 0
  config.tasks.page_clock = True
  assert grpo.env_spec(config)["episode_max_time_ms"] is None  # each page's own limit


def test_config_is_refused_before_any_work():
  config = grpo_config.get_config("smoke")
  config.grpo.group_size = 1
  with pytest.raises(ConfigError, match="grpo.group_size"):
    grpo.check_config(config)
  config = grpo_config.get_config("smoke")
  config.tasks.names = "click-buton"
  with pytest.raises(ConfigError, match="tasks.names"):
    grpo.check_config(config)


@pytest.mark.slow
@pytest.mark.long
def test_lagged_rounds_are_collected_while_the_learner_trains(pipeline, tmp_path):
  """`max_lag=1` on the same IL start: round 1 acts with the start (lag 0), later rounds with the weights one update
  old, and round 2's collection runs beside round 1's update, so the learner waits less for it than it took."""
  config, workdir, _ = pipeline
  config = grpo_config.get_config("smoke")
  config.grpo.update(max_lag=1, rounds=3)
  lagged = str(tmp_path / "lagged")
  for stage in ("tasks", "il"):
    shutil.copytree(os.path.join(workdir, stage), os.path.join(lagged, stage))
  out = os.path.join(lagged, "grpo")
  grpo.stage_grpo(config, lagged, out)
  for r, lag in ((1, 0), (2, 1), (3, 1)):
    trajs = _round(lagged, r)
    assert trajs and {t.meta["policy_lag"] for t in trajs} == {lag}, r
  with open(os.path.join(out, "rounds.json")) as f:
    log = json.load(f)
  assert [m["round"] for m in log] == [1, 2, 3]
  assert log[1]["wait_s"] < log[1]["collect_s"], log[1]


@pytest.mark.slow
@pytest.mark.long
def test_the_smollm_variant_runs_end_to_end_on_a_two_layer_cut(smollm2_cut, tmp_path):
  """`configs/grpo.py:smollm` (the checkpoint's own tokenizer and chat template, LoRA rank 8) with SmolLM2 cut to
  two layers and a smoke's budget: solvers' IL, a GRPO round in Chromium, the evaluation of both actors."""
  config = grpo_config.get_config("smollm")
  config.model.hf_checkpoint = smollm2_cut
  config.tasks.update(names="click-button", train_seeds=2, test_seeds=1, max_steps=2)
  config.env.workers = 2
  config.sampling.max_tokens = 16
  config.demos.episodes = 2
  config.il.train.update(steps=2, batch_size=2)
  config.grpo.update(rounds=1, tasks_per_round=1, group_size=2, epochs=1)
  config.grpo.train.batch_size = 2
  config.train.progress_bar = False
  grpo.check_config(config)
  results = grpo.run(config, str(tmp_path))
  assert set(results) == {"il", "grpo"} and all(r["episodes"] == 1 for r in results.values())
  actor = load(str(tmp_path / "grpo" / "actor"), temperature=0.0)
  assert actor.loaded.tokenizer.chat_template and actor.loaded.model.config.num_layers == 2
