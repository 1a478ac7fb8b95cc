"""WebRL end to end (`reference/algorithms.md` §3): `python -m jaxagent.main --config=configs/webrl.py`.

Stages, in order (each writes `<workdir>/<stage>/` and a `DONE` marker; a restarted run skips finished stages and
resumes the running one: rollouts by episode id, trainings from their Orbax checkpoints, phases stage by stage):

  tasks     the sites' text-profile suites (or the benchmark's splits): train tasks to train on, test to evaluate
  sft       the scripted expert's WebRL-format demonstrations → the text decoder fine-tuned on their successful
            steps (π_0, the original's SFT checkpoint; also the ORM's start and the critic's trunk)
  orm       π_0's rollouts on train tasks, judged by the sites' programs → the ORM trained to answer YES/NO on
            them and the demonstrations; its agreement with the judge on held-out episodes
  phase<t>  curriculum (tasks from phase t−1's failures, `proj.webrl.curriculum`: other parameters of their
            templates, `=mutations` a step along the benchmark's tier axis, `=openai` what an LLM writes from them,
            less any test intent;
            through the critic filter)
            → rollouts of π_{t−1} (with `rollout.max_lag` L > 0: of π_{t−1−L}, collected while π_{t−1}
            trains) → ORM labels (the reward; the judge's verdict kept to measure the ORM)
            → critic (continues phase t−1's on this phase's steps and the replay) → actor π_t from π_{t−1}
            with π_ref = π_{t−1} on this phase's steps and the replayed successes (`proj.webrl.replay`)
  eval      π_0 and every phase's actor on the same held-out test episodes at `eval.temperature`:
            `results.json`, TensorBoard, a table

Every policy rollout (ORM data, phases, evaluation) ends early by VAB's rule (`config.early_stop`, recorded in the
actors' format, `agents.webrl.WebRL.early_stop`). Generated tasks have no evaluator: the judge leaves them
unjudged, so judge success rates and the ORM's agreement count judged episodes only.

This file is the stage order; WebRL's parts are in `proj/webrl/`: `data` (rows and samples), `warmup`, `orm`,
`curriculum`, `critic` (its features, training and the actor's advantages) and `replay`.
"""

from __future__ import annotations

import itertools
import os

import numpy as np

from jaxagent.agents.webrl import WebRL
from jaxagent.data import conversation
from jaxagent.data.tokenizer import fit_tokenizer
from jaxagent.envs.sites.expert import ScriptedExpert
from jaxagent.pipeline import async_collect, device, distributed, report, rollout
from jaxagent.pipeline import tasks as tasks_lib
from jaxagent.pipeline.config import ConfigError, check_count, stage_config
from jaxagent.pipeline.evaluate import evaluate_actors, evaluate_control, write_results
from jaxagent.pipeline.finetune import finetune
from jaxagent.pipeline.policy import load_actor
from jaxagent.pipeline.stages import Stages, read_json, write_json
from jaxagent.pipeline.tasks import draw_episodes, suite, success_rate, test_episodes
from jaxagent.proj.webrl import critic as critic_lib
from jaxagent.proj.webrl import curriculum, data, orm, replay, warmup
from jaxagent.rl.losses import WEBRL_NORMALIZE
from jaxagent.train.losses import webrl_actor_loss, webrl_actor_loss_paper, weighted_token_nll

SPLIT_KEYS = ("demos.split", "orm.split", "curriculum.split")  # where each stage draws its tasks
CHOICES = {
    "env.browser": ("chromium", "text"),
    "model.kind": ("decoder",),
    "html": ("compact", "full"),
    "reward": ("orm", "judge"),
    **{key: tasks_lib.TRAIN_SPLITS for key in SPLIT_KEYS},
    "actor.loss": ("code", "paper", "sft"),
    "actor.normalize": WEBRL_NORMALIZE,
    "orm.page": orm.PAGES,
    "curriculum.generator": ("variations", "mutations", "openai"),
    "orm.held_out": orm.HELD_OUT,
}
LISTS = {"curriculum.kinds": curriculum.MUTATIONS}


def run(config, workdir: str) -> dict:
  """The stages above, in order, on a config `jaxagent.main` has checked (`check_config`)."""
  stages = Stages(workdir, "webrl", config)
  stages.run("tasks", lambda out: tasks_lib.stage_tasks(config, out, "text"))
  stages.run("sft", lambda out: stage_sft(config, workdir, out))
  stages.run("orm", lambda out: stage_orm(config, workdir, out))
  n = int(config.phases)
  collect = lambda i, actor: collect_phase(config, workdir, i + 1, actor, collector.lag(i))  # noqa: E731
  with async_collect.AsyncCollector(collect, n, int(config.rollout.max_lag), gated=True,
                                    done=lambda i: phase_stages(config, workdir, i + 1).is_done("rollouts")
                                    ) as collector:
    collector.publish(0, phase_actor(workdir, 0))
    collector.allow(0)
    for t in range(1, n + 1):
      learn_phase(config, workdir, t, collector)
  results = stages.run("eval", lambda out: stage_eval(config, workdir, out))
  print("\n" + report.policy_table(results))
  print(stages.table())
  return results


# ------------------------------------------------------------------------------------------ stages


def stage_sft(config, workdir, out):
  """The expert's demonstrations on `demos.split` train tasks → π_0 trained on their successful steps."""
  tasks = draw_episodes(suite(workdir, config.demos.split), int(config.demos.episodes), int(config.seed), "demo")
  trajs = device.rollout(config, env_spec(config, expert=True), ScriptedExpert("webrl", **format_options(config)),
                         tasks, os.path.join(out, "demos"), "scripted_expert:webrl", gamma=data.GAMMA)
  items = data.sft_samples(trajs, int(config.sft.augment.copies), int(config.seed))
  if not items:
    raise RuntimeError("the scripted expert solved no demonstration task; check the sites and the browser")
  sft_config = stage_config(config, config.sft)
  if config.data.tokenizer == "demos":
    sft_config.data.tokenizer = fit_tokenizer(os.path.join(out, "fitted_tokenizer"), conversation.texts(items))
  start = warmup.train(config, config.sft, sft_config.data.tokenizer, items, data.cut_html, os.path.join(out, "warmup"))
  finetune(sft_config, out, items, agent=agent_format(config), init_from=start)
  return {"demos": len(trajs), "expert_success": success_rate(trajs), "samples": len(items)}


def stage_orm(config, workdir, out):
  """π_0's judged rollouts on train tasks, the demonstrations and the expert's near misses → the ORM, initialised
  from π_0; its agreement with the judge on `orm.val_fraction` of the rollouts and near misses, held out."""
  trajs, decoys, train, val = orm_episodes(config, workdir, out)
  items = [orm.orm_sample(t, t.success == 1.0, f"orm-{i}", **orm.text_options(config)) for i, t in enumerate(train)]
  held_out = orm.train(config, workdir, out, items, val)
  tasks_lib.write_tasks(os.path.join(out, "failed.jsonl"), [t.task for t in trajs if t.success != 1.0])
  return {"rollouts": len(trajs), "rollout_success": success_rate(trajs), "near_misses": len(decoys),
          "near_miss_success": success_rate(decoys), "train_episodes": len(train),
          "train_positive": sum(t.success == 1.0 for t in train), "held_out": held_out}


def orm_episodes(config, workdir: str, out: str) -> tuple[list, list, list, list]:
  """The ORM's judged episodes on train tasks (run into `out`, or read back where they are): π_0's rollouts, the
  expert's near misses, and the (train, held-out) split of `orm.held_out` (`orm.split_held_out`). Returns
  (rollouts, near misses, train, held out)."""
  pool = suite(workdir, config.orm.split)
  tasks = draw_episodes(pool, int(config.orm.episodes), int(config.seed) + 1, "orm")
  trajs = [t for t in _rollout(config, os.path.join(workdir, "sft"), float(config.orm.temperature), tasks,
                               os.path.join(out, "store"), "sft@orm", int(config.seed)) if data.usable(t)]
  misses = orm.near_misses(draw_episodes(pool, int(config.orm.near_misses), int(config.seed) + 4, "miss"), pool,
                           int(config.seed) + 5)
  decoys = device.rollout(config, env_spec(config, expert=True), ScriptedExpert("webrl", **format_options(config)),
                          misses, os.path.join(out, "near_misses"), "scripted_expert:near_miss", gamma=data.GAMMA)
  judged = trajs + [t for t in decoys if data.usable(t)]
  train, val = orm.split_held_out(judged, [t for t in data.demos(workdir) if data.usable(t)],
                                  float(config.orm.val_fraction), int(config.seed) + 2, config.orm.held_out)
  return trajs, decoys, train, val


def collect_phase(config, workdir: str, t: int, behaviour: str, lag: int) -> dict:
  """Phase t's curriculum and `behaviour`'s rollouts on it: π_{t−1}, or with `rollout.max_lag` L > 0 the actor
  `lag` ≤ L phases older, collecting while π_{t−1} trains (`pipeline.async_collect`)."""
  phase = phase_stages(config, workdir, t)

  def stage_curriculum(out):
    want = int(config.curriculum.tasks)
    n = 2 * want if config.curriculum.critic_filter else want
    candidates, info = curriculum.candidates(config, workdir, t, n, out)
    kept = candidates[:want]
    if config.curriculum.critic_filter and t > 1:  # phase 1 has no trained critic to filter with
      passed = curriculum.critic_passed(config, workdir, t, candidates, os.path.join(out, "round0_feats.npy"))
      info.update(passed_filter=len(passed), filter_applied=bool(passed))
      kept = passed[:want] if passed else kept  # none passing: the unfiltered draw, said in the summary
    tasks_lib.write_tasks(os.path.join(out, "tasks.jsonl"), kept)
    return {**info, "tasks": len(kept), "templates": sorted({c.template for c in kept})}

  def stage_rollouts(out):
    tasks = tasks_lib.read_tasks(os.path.join(phase.workdir, "curriculum", "tasks.jsonl"))
    trajs = _rollout(config, behaviour, float(config.rollout.temperature), tasks, os.path.join(out, "store"),
                     f"actor{t - 1 - lag}@phase{t}", int(config.seed) + 10 * t,
                     meta={"behaviour_actor": behaviour, "policy_lag": lag})
    judged = data.judged(trajs)
    return {"episodes": len(trajs), "judged": len(judged), "judge_success": success_rate(judged),
            "early_stops": sum("early_stop" in x.meta for x in trajs), "behaviour": behaviour, "lag": lag}

  phase.run("curriculum", stage_curriculum)
  return phase.run("rollouts", stage_rollouts)


def learn_phase(config, workdir: str, t: int, collector: async_collect.AsyncCollector) -> None:
  """Phase t once its rollouts are in: ORM labels → critic → (phase t+1 may now collect) → actor π_t."""
  if not phase_stages(config, workdir, t).is_done("rollouts"):
    collector.result(t - 1)
  phase = phase_stages(config, workdir, t)  # after the collector's stages, so their timings are kept
  trajs = data.phase_episodes(workdir, t)

  def stage_labels(out):
    probs = orm.score(config, os.path.join(workdir, "orm", "model"), trajs)
    labels = {x.task.id: float(p) for x, p in zip(trajs, probs)}
    if distributed.is_main():
      write_json(os.path.join(out, "orm.json"), labels)
    rewards = replay.rewards(config, trajs, labels)
    tasks_lib.write_tasks(os.path.join(out, "failed.jsonl"), [x.task for x, r in zip(trajs, rewards) if r < 1.0])
    return {"episodes": len(trajs), "orm_success": float(np.mean(probs >= 0.5)) if len(trajs) else 0.0,
            "judge_success": success_rate(data.judged(trajs)),
            "orm_vs_judge": orm.agreement(probs, [x.success for x in trajs])}  # judged episodes only

  phase.run("labels", stage_labels)
  rows = data.step_rows(trajs, replay.phase_rewards(config, workdir, t, trajs), **data.row_options(config))
  history = replay.history(config, workdir, t)
  phase.run("critic", lambda out: critic_lib.train_phase(config, workdir, t, rows, history, out))
  collector.allow(t)  # phase t+1's curriculum reads this phase's failures and critic
  phase.run("actor", lambda out: train_actor(config, workdir, t, rows, history, out))
  collector.publish(t, phase_actor(workdir, t))


def train_actor(config, workdir: str, t: int, rows: dict, history: dict, out: str) -> dict:
  """π_t from π_{t−1} on this phase's steps (advantages from the critic) and the replayed successes."""
  prev = phase_actor(workdir, t - 1)
  adv = critic_lib.advantages(config, workdir, t, rows, history)
  items, chosen, ref = replay.actor_samples(config, rows, history, prev, int(config.seed) + 30 + t)
  train = [dict(items[i], advantage=float(adv[i]), ref_logp=float(ref["logp"][i])) for i in chosen]
  if config.actor.loss == "sft":
    train = [dict(items[i]) for i in chosen if adv[i] >= 0]
    loss = weighted_token_nll
  elif config.actor.loss == "paper":
    loss = webrl_actor_loss_paper(float(config.actor.beta))
  else:
    loss = webrl_actor_loss(bool(config.actor.add_sft_loss), config.actor.normalize)
  actor_config = stage_config(config, config.actor, seed_offset=40 + t, steps=data.actor_steps(config, len(train)))
  finetune(actor_config, out, train, agent=agent_format(config), init_from=prev, loss=loss)
  n_now = len(rows["state"])
  return {"phase_steps": n_now, "replay_candidates": len(history["state"]), "replayed": len(chosen) - n_now,
          "trained_on": len(train), "steps": int(actor_config.train.steps),
          "positive_advantage": float(np.mean(adv[chosen] >= 0)) if chosen else 0.0,
          "mean_ref_prob": float(np.mean(np.exp(ref["logp"] / np.maximum(ref["tokens"], 1)))) if items else None}


def stage_eval(config, workdir, out):
  """π_0 and every phase's actor on the held-out test episodes; the ORM's agreement with the judge beside."""
  phases = range(1, int(config.phases) + 1)
  actors = {"sft": phase_actor(workdir, 0), **{f"phase{t}": phase_actor(workdir, t) for t in phases}}
  results = evaluate_actors(config, actors, test_episodes(config, workdir), out, env_spec=env_spec(config),
                            gamma=data.GAMMA)
  results.update(evaluate_control(config, actors, workdir, out, env_spec=env_spec(config), gamma=data.GAMMA))
  orm_summary = read_json(os.path.join(workdir, "orm", "DONE"))
  labels = [read_json(os.path.join(workdir, f"phase{t}", "labels", "DONE")) for t in phases]
  held = {"orm_held_out": orm_summary["held_out"], "orm_by_phase": [p["orm_vs_judge"] for p in labels]}
  write_results(os.path.join(workdir, "results.json"), results)
  if distributed.is_main():
    write_json(os.path.join(workdir, "orm_agreement.json"), held)
  return results


# ---------------------------------------------------------------------------------------- helpers


def format_options(config) -> dict:
  """The WebRL format's options: HTML, prompt cut, and the episode rule (`config.early_stop`)."""
  return {"compact": config.html == "compact", "max_prompt_chars": int(config.prompt_chars),
          "stop_parse_failures": int(config.early_stop.parse_failures), "stop_repeats": int(config.early_stop.repeats)}


def agent_format(config) -> WebRL:
  return WebRL(**format_options(config))


def env_spec(config, expert: bool = False) -> dict:
  """The desktop window on the bundled sites, observed as WebRL's simplified HTML (no screenshots)."""
  return rollout.site_env("text", "html", config.tasks.seed, config.env,
                          **({"oracle_targets": True} if expert else {}))


def _rollout(config, model_dir: str, temperature: float, tasks, store_dir: str, name: str, seed: int, meta=None):
  actor = load_actor(config, model_dir, temperature, seed)
  return device.rollout(config, env_spec(config), actor, tasks, store_dir, name, gamma=data.GAMMA, meta=meta,
                        early_stop=actor.fmt.early_stop)


def phase_actor(workdir: str, t: int) -> str:
  return os.path.join(workdir, "sft") if t == 0 else os.path.join(workdir, f"phase{t}", "actor")


def phase_stages(config, workdir: str, t: int) -> Stages:
  return Stages(os.path.join(workdir, f"phase{t}"), f"webrl/phase{t}", config)


# ----------------------------------------------------------------------------------------- config


def check_config(config) -> None:
  """The rules across keys `pipeline.config.validate` cannot see (`jaxagent.main` calls it before any work)."""
  tasks_lib.check_split_keys(config, SPLIT_KEYS)
  if config.env.browser == "text" and config.html != "compact":
    raise ConfigError("config.env.browser='text' with config.html='full': the full HTML carries each element's "
                      "box (data-bbox), which only a browser lays out; set --config.html=compact or "
                      "--config.env.browser=chromium")
  if config.data.tokenizer == "demos" and config.model.hf_checkpoint:
    raise ConfigError(f"config.data.tokenizer='demos' fits a new vocabulary, which model.hf_checkpoint="
                      f"{config.model.hf_checkpoint!r}'s embeddings do not have; set --config.data.tokenizer='' "
                      "(the checkpoint's own tokenizer)")
  for stage, (key, least, fix) in itertools.product(("sft", "orm"), (("steps", 0, 0), ("prompt_chars", 1, 200))):
    check_count(config, f"{stage}.warmup.{key}", least, fix)
  check_count(config, "replay.chunks", 1, 8, "the original's 8 worker chunks, or 1 for one success per task")
  check_count(config, "sft.augment.copies", 0, 0, "swapped copies of each demonstration")
  if isinstance(config.actor.epochs, bool) or not config.actor.epochs > 0:
    raise ConfigError(f"config.actor.epochs={config.actor.epochs!r}: must be > 0 (passes over a phase's samples at "
                      "most); set --config.actor.epochs=2")
  if config.curriculum.generator != "openai":
    return
  if not config.curriculum.openai.base_url:
    raise ConfigError("config.curriculum.openai.base_url is required with curriculum.generator=openai; set "
                      "--config.curriculum.openai.base_url=http://HOST:PORT/v1 (any OpenAI-compatible endpoint)")
  for key in ("turns", "seeds"):
    check_count(config, f"curriculum.openai.{key}", 1, "1 (or more)")
  if config.reward == "judge":
    raise ConfigError("config.reward='judge' needs a verdict on every episode, and curriculum.generator=openai "
                      "writes tasks without an evaluator; set --config.reward=orm or "
                      "--config.curriculum.generator=variations")

