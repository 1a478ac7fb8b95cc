"""DigiRL end to end (`reference/algorithms.md` §4): `python -m jaxagent.main --config=configs/digirl.py`.

Stages, in order (each writes `<workdir>/<stage>/` and a `DONE` marker; a restarted run skips finished stages and
resumes the running one: rollouts by episode id, trainings from their Orbax checkpoints, the online phase by
iteration):

  tasks           the phone-profile (AitW action space) suites: train tasks for every training episode, test
                  tasks for the evaluation alone; the actor reads the screenshot, or with `env.observation=html`
                  the screen's simplified HTML (a text decoder; `agents.autoui_text`)
  il              the scripted expert's demonstrations → the VLM trained on them (AutoUI's SFT checkpoint)
  offline_data    the IL actor's judged rollouts on the train tasks at `offline.temperature` (or `data.path`)
  critics         image features of every state; the instruction-level critic V^inst on every offline trajectory
                  and the step-level double critic V^step on the replay, their newest `capacity` steps (the
                  code's offline phase, §4.8)
  filtered_bc     the baseline: the newest `capacity` steps of the top-10 % trajectories by reward (the code's
                  filtered buffer), trained from the IL actor
  digirl_offline  the same buffer's steps whose advantage passes the hard filter, trained from the IL actor
  online          (off2on, online) iterations of: rollouts of the current actor on train tasks → V^inst on all
                  the trajectories and V^step on the replay continue training → the actor continues on the
                  newest `capacity` steps of the top-10 % trajectories by reward − V^inst with A > 0 (Filtered
                  BC: top-10 % by reward)
  eval            every trained actor on the same held-out test episodes at `eval.temperature`: `results.json`,
                  TensorBoard, a table

DigiRL's data, critics and actor samples are `proj.digirl`'s (`data`, `critics`, `training`); this file orders them
into stages and names their directories.
"""

from __future__ import annotations

import functools
import os
import time

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.judges import programmatic
from jaxagent.pipeline import async_collect, device, distributed, report, rollout
from jaxagent.pipeline.config import check_count, stage_config
from jaxagent.pipeline.evaluate import evaluate_actors, evaluate_control, write_results
from jaxagent.pipeline.policy import load_actor
from jaxagent.pipeline.stages import Stages, read_json, write_text
from jaxagent.pipeline.tasks import (TRAIN_SPLITS, check_split_keys, draw_episodes, suite, success_rate,
                                     test_episodes)
from jaxagent.proj.digirl import critics, training
from jaxagent.proj.digirl.data import Data, load_store
from jaxagent.rl.losses import AUTOUI_PROB_CLAMP
from jaxagent.train.losses import sequence_nll, weighted_token_nll

SPLIT_KEYS = ("demos.split", "offline.split", "online.split")  # where each stage draws its tasks
STAGES = ("tasks", "il", "offline_data", "critics", "filtered_bc", "digirl_offline", "online", "eval")
CHOICES = {
    "env.browser": ("chromium", "text"),  # text: env.observation=html's pages without a browser
    "env.observation": device.OBSERVATIONS,
    "model.kind": ("vlm", "autoui", "decoder"),  # decoder: env.observation=html
    "mode": ("offline", "off2on", "online"),
    "algorithm": ("digirl", "filtered_bc"),
    **{key: TRAIN_SPLITS for key in SPLIT_KEYS},
    "parse": ("faithful", "lenient"),
    "judge.kind": ("programmatic", "llm"),
    "actor.loss": ("digirl", "token_nll"),
    "actor.advantage": ("code", "dr"),
}
# `--seeds` pairs each policy with the IL actor, and these as the paper compares them (policy, baseline)
PAIRS = (("digirl_off2on", "filtered_bc"), ("digirl_off2on", "digirl_offline"), ("digirl_offline", "filtered_bc"))


def run(config, workdir: str) -> dict:
  stages = Stages(workdir, "digirl", config)
  offline, digirl = config.mode != "online", config.algorithm == "digirl"
  stages.run("tasks", lambda out: device.stage_tasks(config, out))
  stages.run("il", lambda out: device.stage_il(config, workdir, out, float(config.gamma)))
  if offline:
    stages.run("offline_data", lambda out: stage_offline_data(config, workdir, out))
    stages.run("critics", lambda out: stage_critics(config, workdir, out))
    stages.run("filtered_bc", lambda out: stage_offline_actor(config, workdir, out, "filtered_bc"))
    if digirl:
      stages.run("digirl_offline", lambda out: stage_offline_actor(config, workdir, out, "digirl"))
  if config.mode != "offline":
    stages.run("online", lambda out: stage_online(config, workdir, out))
  results = stages.run("eval", lambda out: stage_eval(config, workdir, out))
  print("\n" + report.policy_table(results, pairs=PAIRS))
  print(stages.table())
  return results


def check_config(config) -> None:
  """The keys `pipeline.config.validate` has no rule for (`jaxagent.main` calls it before any work)."""
  check_count(config, "capacity", 0, "2000 (the code's)", "the replay buffers' transitions; 0 = unbounded")
  check_split_keys(config, SPLIT_KEYS)
  device.check_observation(config, text=True)


# ------------------------------------------------------------------------------------------ stages


def stage_offline_data(config, workdir, out):
  if config.data.path:
    trajs = rollout.episodes(TrajectoryStore(offline_store(config, workdir)))
    if not trajs:
      raise ValueError(f"config.data.path={config.data.path!r} holds no trajectories")
    return {"source": config.data.path, "episodes": len(trajs), "success": success_rate(trajs)}
  tasks = draw_episodes(suite(workdir, config.offline.split), int(config.offline.episodes), int(config.seed) + 1,
                        "off")
  trajs = _rollout(config, os.path.join(workdir, "il"), float(config.offline.temperature), tasks,
                   os.path.join(out, "store"), "il_actor@offline", int(config.seed))
  return {"episodes": len(trajs), "success": success_rate(trajs), "steps": sum(len(t.steps) for t in trajs),
          "ended_by_malformed_action": sum(bool(t.steps) and t.steps[-1].action is not None
                                           and t.steps[-1].action.kind == types.ActionKind.IMPOSSIBLE for t in trajs)}


def stage_critics(config, workdir, out):
  data = offline_data(config, workdir)
  return training.train_critics(config, data, out, (config.traj_critic, config.critic))[2]


def stage_offline_actor(config, workdir, out, algorithm):
  """The offline phase's actor: trained from the IL actor on `filterbc_buffer`'s trajectories (the code's offline
  DigiRL also filters by reward, not V^inst)."""
  data = offline_data(config, workdir)
  keep = critics.filterbc_keep(data.trajs, float(config.actor.quantile))
  step_critic = training.restore_critics(config, data, os.path.join(workdir, "critics"),
                                         (config.traj_critic, config.critic))[1] if algorithm == "digirl" else None
  return train_actor(config, workdir, out, config.actor, data, algorithm, keep, step_critic,
                     os.path.join(workdir, "il"), seed_offset=7)


def stage_online(config, workdir, out):
  """`online.iterations` rounds of collect → critics → actor (`offpolicy_train_loop`'s online loop), each step a
  stage `iter<i>_<step>` of `out`; with `online.max_lag` > 0 each round's rollouts run while the previous rounds
  train (`pipeline.async_collect`)."""
  rounds = Stages(out, "digirl/online", config)
  if config.mode == "off2on":
    data = offline_data(config, workdir)
    actor = actor_dir(workdir, "digirl_offline" if config.algorithm == "digirl" else "filtered_bc")
    critics_from = os.path.join(workdir, "critics"), (config.traj_critic, config.critic)
  else:
    data, actor, critics_from = Data(), os.path.join(workdir, "il"), None
  collected: dict[int, tuple] = {}  # round -> what `collect_round` read, handed from the collector to the learner
  n, history = int(config.online.iterations), []
  with async_collect.AsyncCollector(functools.partial(collect_round, config, workdir, rounds, collected), n,
                                    int(config.online.max_lag), done=lambda i: rounds.is_done(f"iter{i}_rollouts")
                                    ) as collector:
    collector.publish(0, actor)
    for i in range(n):
      summary = rounds.run(f"iter{i}_rollouts", lambda o: collector.result(i))
      data.add(*(collected.pop(i, None) or round_data(config, workdir, rounds.dir(f"iter{i}_rollouts"))))
      info, critics_from = learn_round(config, workdir, rounds, i, data, actor, critics_from)
      actor = actor_dir(out, f"iter{i}_actor")
      collector.publish(i + 1, actor)
      history.append({"iteration": i, "rollout_success": summary["success"], "lag": summary.get("lag", 0), **info})
  return {"actor": actor, "iterations": history}


def collect_round(config, workdir, rounds: Stages, collected: dict, i: int, behaviour: str) -> dict:
  """Round i's rollouts by `behaviour`, the actor `AsyncCollector.lag(i)` updates back; puts the round's data in
  `collected[i]`, so that the learner does not read it again."""
  o, t0 = rounds.dir(f"iter{i}_rollouts"), time.monotonic()
  lag = i - async_collect.behaviour_version(i, int(config.online.max_lag))
  trajs = _rollout(config, behaviour, float(config.online.temperature), online_episodes(config, workdir, i),
                   os.path.join(o, "store"), f"actor@online{i}", int(config.seed) + 10 + i,
                   meta={"behaviour_actor": behaviour, "policy_lag": lag})
  collected[i] = round_data(config, workdir, o)
  return {"success": success_rate(trajs), "behaviour": behaviour, "lag": lag, "collect_s": time.monotonic() - t0}


def learn_round(config, workdir, rounds: Stages, i: int, data: Data, actor: str, critics_from
                ) -> tuple[dict, tuple | None]:
  """Round i's critics (DigiRL: V^inst and V^step continue from `critics_from` on all the data) and actor (from
  `actor`); returns the actor stage's summary and the critics the next round continues from."""
  traj_critic = step_critic = None
  if config.algorithm == "digirl":
    blocks = (config.online.traj_critic, config.online.critic)
    start = training.restore_critics(config, data, *critics_from) if critics_from else None
    rounds.run(f"iter{i}_critics", lambda o: training.train_critics(config, data, o, blocks, start)[2])
    critics_from = rounds.dir(f"iter{i}_critics"), blocks
    traj_critic, step_critic = training.restore_critics(config, data, *critics_from)
  keep = training.online_keep(config, data, traj_critic)
  info = rounds.run(f"iter{i}_actor", lambda o: train_actor(
      config, workdir, o, config.online.actor, data, config.algorithm, keep, step_critic, actor, seed_offset=8 + i))
  return info, critics_from


def stage_eval(config, workdir, out):
  actors, options = policies(config, workdir), dict(env_spec=device.env_spec(config), gamma=float(config.gamma),
                                                    judge=lambda store: _judge(config, store))
  results = evaluate_actors(config, actors, test_episodes(config, workdir), out, **options)
  results.update(evaluate_control(config, actors, workdir, out, **options))
  write_results(os.path.join(workdir, "results.json"), results)
  return results


def policies(config, workdir) -> dict[str, str]:
  """The evaluated actors, by name → model directory."""
  out = {"il": os.path.join(workdir, "il")}
  if config.mode != "online":
    out["filtered_bc"] = actor_dir(workdir, "filtered_bc")
    if config.algorithm == "digirl":
      out["digirl_offline"] = actor_dir(workdir, "digirl_offline")
  if config.mode != "offline":
    out[f"{config.algorithm}_{config.mode}"] = read_json(os.path.join(workdir, "online", "DONE"))["actor"]
  return out


# ---------------------------------------------------------------------------------------- helpers


def _judge(config, store_dir: str):
  """The programmatic judge, or DigiRL's per-step LLM evaluator reading screenshots from `store_dir`."""
  if config.judge.kind == "programmatic":
    return None  # `device.rollout`'s programmatic default
  cfg = config.judge.to_dict()
  cfg["llm"] = dict(cfg["llm"], image_root=store_dir)
  return programmatic.make_judge(cfg)


def _rollout(config, model_dir, temperature, tasks, store_dir, name, seed, meta=None):
  actor = load_actor(config, model_dir, temperature, seed)
  return device.rollout(config, device.env_spec(config), actor, tasks, store_dir, name, gamma=float(config.gamma),
                        judge=_judge(config, store_dir), meta=meta)


def offline_store(config, workdir: str) -> str:
  return config.data.path or os.path.join(workdir, "offline_data", "store")


def offline_data(config, workdir: str) -> Data:
  """The offline store's episodes with their screen features (cached in `critics/feats.npz`)."""
  data = Data()
  data.add(*load_store(config, os.path.join(workdir, "il"), offline_store(config, workdir),
                       os.path.join(workdir, "critics", "feats.npz")))
  return data


def round_data(config, workdir: str, round_dir: str) -> tuple:
  """A round's episodes with their screen features (cached in its `feats.npz`): `Data.add`'s arguments."""
  return load_store(config, os.path.join(workdir, "il"), os.path.join(round_dir, "store"),
                    os.path.join(round_dir, "feats.npz"))


def online_episodes(config, workdir, iteration: int) -> list[types.Task]:
  """Iteration `iteration`'s rollouts: a seeded draw of `online.split` tasks (the code samples tasks at random)."""
  return draw_episodes(suite(workdir, config.online.split), int(config.online.episodes),
                       int(config.seed) + 100 + iteration, f"on{iteration}.")


def train_actor(config, workdir: str, out: str, block, data: Data, algorithm: str, keep, step_critic,
                init_from: str, seed_offset: int) -> dict:
  """The actor from `init_from` on the steps `training.actor_picks` takes from the kept trajectories (plus the
  demonstrations at `actor.il_weight`); `out` records `init_from`, the stage's actor if no step was picked."""
  picks, info = training.actor_picks(config, data, algorithm, keep, step_critic)
  _record_init(out, init_from)
  loss = sequence_nll(AUTOUI_PROB_CLAMP) if config.actor.loss == "digirl" else weighted_token_nll
  items = data.samples(picks, os.path.join(out, "images"), device.reads_text(config))
  if not items:
    return {**info, "note": f"no step passed the filter; the actor equals {init_from}"}
  demos = device.finetune_with_demos(stage_config(config, block, seed_offset=seed_offset), workdir, out, items,
                                     float(config.actor.il_weight), init_from, loss)
  return {**info, "trained_on": len(items) + demos}


def actor_dir(workdir: str, stage: str) -> str:
  """A stage's trained actor: its own workdir, or the one it started from when it had nothing to train on."""
  path = os.path.join(workdir, stage)
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return path
  with open(os.path.join(path, "init_from")) as f:
    return f.read().strip()


def _record_init(out: str, init_from: str) -> None:
  if distributed.is_main():  # read once the stage is over (`actor_dir`), after the stage's barrier
    write_text(os.path.join(out, "init_from"), init_from)
