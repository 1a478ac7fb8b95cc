"""Group-relative online RL for multi-turn agents: `python -m jaxagent.main --config=configs/grpo.py`.

The algorithm is a config and a loss: G rollouts of each task from identical resets form a group, each step's
advantage is its rollout's return against the group's (GRPO, Shao et al. 2024; Dr. GRPO's unnormalised form; or
GiGPO's step-level groups of identical states added, Feng et al. 2025), and the policy trains on exactly the tokens
it sampled with the clipped surrogate and a k3 KL to its start (`rl.losses.ppo_clip_loss`). No critic, no reward
model: the environment's reward is the return. Stages (each `<workdir>/<stage>/` with a `DONE` marker; a restarted
run skips finished stages and resumes the rounds from the learner's last checkpoint, replaying stored rollouts):

  tasks   MiniWoB++ tasks (`envs.miniwob.HEADLINE_TASKS`) × instance seeds: train seeds and held-out test seeds,
          which never overlap (`envs.miniwob.split_seeds`)
  il      the DOM-reading scripted solvers' demonstrations on train seeds (`envs.miniwob_solvers`) → the IL start:
          a tiny decoder on WebRL's simplified-HTML prompts and actions
  grpo    `grpo.rounds` rounds of: `tasks_per_round` train tasks × `group_size` rollouts at `grpo.temperature` by the
          acting policy (weights in memory, `grpo.max_lag` rounds old) → advantages → `grpo.epochs` passes of
          clipped updates (`proj.grpo.learner`) → the new weights to the policy, without a checkpoint round trip
  eval    the IL start and the GRPO actor on every held-out test episode, once each, at `eval.temperature`
"""

from __future__ import annotations

import os
import random
import time

from jaxagent.agents.webrl import WebRL
from jaxagent.data import conversation
from jaxagent.data.tokenizer import fit_tokenizer
from jaxagent.envs import miniwob
from jaxagent.judges.programmatic import RewardJudge
from jaxagent.pipeline import device, report
from jaxagent.pipeline.async_collect import AsyncCollector, behaviour_version
from jaxagent.pipeline.config import names, stage_config
from jaxagent.pipeline.evaluate import evaluate_actors, write_results
from jaxagent.pipeline.finetune import finetune
from jaxagent.pipeline.policy import load_actor
from jaxagent.pipeline.rollout import Rollouts
from jaxagent.pipeline.stages import Stages, write_json
from jaxagent.pipeline.tasks import draw_episodes, success_rate, suite, write_tasks
from jaxagent.proj.grpo import groups
from jaxagent.proj.grpo.learner import Learner

STAGES = ("tasks", "il", "grpo", "eval")
CHOICES = {
    "suite": ("miniwob",),
    "model.kind": ("decoder",),
    "env.browser": ("chromium",),
    "grpo.advantage": groups.ADVANTAGES,
    "grpo.reward": groups.REWARDS,
    "grpo.loss_agg": ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"),
}


def run(config, workdir: str) -> dict:
  stages = Stages(workdir, "grpo", config)
  stages.run("tasks", lambda out: stage_tasks(config, out))
  stages.run("il", lambda out: stage_il(config, workdir, out))
  stages.run("grpo", lambda out: stage_grpo(config, workdir, out))
  results = stages.run("eval", lambda out: stage_eval(config, workdir, out))
  print("\n" + report.policy_table(results))
  print(stages.table())
  return results


# ------------------------------------------------------------------------------------------ stages


def stage_tasks(config, out):
  chosen = task_names(config)
  counts = {}
  for split, n in (("train", config.tasks.train_seeds), ("test", config.tasks.test_seeds)):
    tasks = miniwob.training_suite(split, int(n), names=chosen, max_steps=int(config.tasks.max_steps))
    counts[split] = write_tasks(os.path.join(out, f"{split}.jsonl"), tasks)
  return {**counts, "tasks": chosen}


def stage_il(config, workdir, out):
  """The solvers' demonstrations on train episodes → the IL start, trained on their successful episodes' steps."""
  from jaxagent.envs.miniwob_solvers import MiniWoBExpert  # pylint: disable=g-import-not-at-top
  tasks = draw_episodes(suite(workdir, "train"), int(config.demos.episodes), int(config.seed), "demo")
  trajs = device.rollout(config, env_spec(config), MiniWoBExpert("webrl", **format_options(config)), tasks,
                         os.path.join(out, "demos"), "miniwob_solver:webrl", gamma=1.0, judge=RewardJudge())
  items = conversation.step_samples([t for t in trajs if t.success == 1.0])
  if not items:
    raise RuntimeError("the solvers solved no demonstration episode; check MiniWoB++ and the browser")
  il_config = stage_config(config, config.il)
  if config.data.tokenizer == "demos":
    il_config.data.tokenizer = fit_tokenizer(os.path.join(out, "fitted_tokenizer"), conversation.texts(items))
  finetune(il_config, out, items, agent=agent_format(config))
  return {"demos": len(trajs), "solver_success": success_rate(trajs), "samples": len(items)}


def stage_grpo(config, workdir, out):
  """The rounds; `rounds.json` holds each one's training success, mean return (under `grpo.reward`), fraction of
  episodes that ran out of steps, identical-reset check, loss, and times (`collect_s` its rollouts took, `wait_s`
  the learner waited for them).
  With `grpo.max_lag` L > 0 a thread collects the rounds up to r + L while the learner trains on round r
  (`pipeline.async_collect`): collection and updates overlap, each round acting with weights L updates old (its
  episodes' `meta["policy_lag"]`)."""
  g, lag = config.grpo, int(config.grpo.max_lag)
  learner = Learner(config, stage_config(config, g), os.path.join(workdir, "il"), os.path.join(out, "actor"),
                    agent_format(config))
  policy = load_actor(config, os.path.join(workdir, "il"), float(g.temperature), int(config.seed))  # the collector's
  train, done_rounds, log = suite(workdir, "train"), learner.round, []

  def collect(i, weights):  # round i + 1 by the weights `behaviour_version(i, lag)`; in the collector's thread
    r, t0 = i + 1, time.monotonic()
    policy.set_weights(weights)
    picked = random.Random(int(config.seed) * 100_003 + r).sample(train, int(g.tasks_per_round))
    trajs = pool.run(policy, groups.group_episodes(picked, int(g.group_size), r),
                     os.path.join(out, "rounds", f"round{r}"), judge=RewardJudge(), name=f"grpo@round{r}",
                     gamma=1.0, early_stop=policy.fmt.early_stop, meta={"policy_lag": i - behaviour_version(i, lag)})
    return trajs, time.monotonic() - t0

  try:
    with Rollouts(env_spec(config), config.env, bool(config.train.progress_bar)) as pool, AsyncCollector(
        collect, int(g.rounds), lag, done=lambda i: i < done_rounds) as collector:
      for version in range(max(0, done_rounds - lag), done_rounds + 1):  # a resumed run has its last weights only
        collector.publish(version, learner.weights())
      for i in range(done_rounds, int(g.rounds)):
        r, t0 = i + 1, time.monotonic()
        trajs, collect_s = collector.result(i)
        timing = {"collect_s": collect_s, "wait_s": time.monotonic() - t0}  # the wait: what overlap did not hide
        adv = groups.step_advantages(trajs, str(g.advantage), float(g.gigpo_gamma), float(g.step_weight),
                                     str(g.reward))
        rows = [{"prompt_ids": s.prompt_ids, "reply_ids": s.reply_ids, "logprobs": s.reply_logprobs,
                 "advantage": float(a)} for t, a_t in zip(trajs, adv) for s, a in zip(t.steps, a_t)
                if s.reply_ids]
        metrics = learner.update(rows, lagged=lag > 0, seed=int(config.seed) * 7919 + r)
        metrics.update(success_rate=success_rate(trajs), identical_resets=groups.identical_resets(trajs),
                       mean_return=sum(groups.episode_return(t, str(g.reward)) for t in trajs) / max(len(trajs), 1),
                       truncated=sum(t.status == "truncated" for t in trajs) / max(len(trajs), 1),
                       round=r, **timing)
        learner.end_round(r, metrics, force=r == int(g.rounds))
        log.append(metrics)
        print(f"grpo round {r}: success {metrics['success_rate']:.2f} return {metrics['mean_return']:+.2f} "
              f"updates {metrics['updates']}", flush=True)
        collector.publish(r, learner.weights())
  finally:
    learner.close()
  write_json(os.path.join(out, "rounds.json"), log)
  return {"rounds": int(g.rounds), "last": log[-1] if log else {}}


def stage_eval(config, workdir, out):
  """The IL start and the GRPO actor on every held-out test episode (once each), same episodes, same temperature."""
  actors = {"il": os.path.join(workdir, "il"), "grpo": os.path.join(workdir, "grpo", "actor")}
  tasks = suite(workdir, "test")
  results = evaluate_actors(config, actors, tasks, out, env_spec=env_spec(config), judge=RewardJudge())
  write_results(os.path.join(workdir, "results.json"), results)
  return results


# ---------------------------------------------------------------------------------------- helpers


def task_names(config) -> list[str]:
  return names(config.tasks.names) or list(miniwob.HEADLINE_TASKS)


def env_spec(config) -> dict:
  """MiniWoB++ pages in Chromium, observed as WebRL's simplified HTML (reward: the task's raw reward). The step
  limit `tasks.max_steps` ends an episode the page does not end; `tasks.page_clock` adds each page's own wall-clock
  limit (−1 "timed out"), under which a reward depends on the machine's speed (`envs.miniwob`, "The clock")."""
  return {"kind": "miniwob", "observation": "html",
          "episode_max_time_ms": None if config.tasks.page_clock else 0}


def format_options(config) -> dict:
  return {"compact": True, "max_prompt_chars": int(config.prompt_chars)}


def agent_format(config) -> WebRL:
  return WebRL(**format_options(config))


def check_config(config) -> None:
  from jaxagent.pipeline.config import ConfigError  # pylint: disable=g-import-not-at-top
  g = config.grpo
  if not isinstance(config.tasks.page_clock, bool):
    raise ConfigError(f"config.tasks.page_clock={config.tasks.page_clock!r}: True or False; set "
                      "--config.tasks.page_clock=false (the step limit alone ends an episode)")
  if int(g.group_size) < 2:
    raise ConfigError(f"config.grpo.group_size={g.group_size}: a group needs at least 2 rollouts to compare")
  if float(g.temperature) <= 0:
    raise ConfigError(f"config.grpo.temperature={g.temperature}: rollouts must sample (> 0)")
  unknown = set(task_names(config)) - set(miniwob.task_names())
  if unknown:
    raise ConfigError(f"config.tasks.names: {sorted(unknown)} are not MiniWoB++ tasks")
  if int(g.tasks_per_round) > len(task_names(config)) * int(config.tasks.train_seeds):
    raise ConfigError(f"config.grpo.tasks_per_round={g.tasks_per_round} exceeds the train split")
