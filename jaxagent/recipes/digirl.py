"""DigiRL end to end (`reference/algorithms.md` §4): `python -m jaxagent.main --config=configs/digirl.py`.

Stages, in order (each writes `<workdir>/<stage>/` and a `DONE` marker; a restarted run skips finished stages and
resumes the running one: rollouts by episode id, trainings from their Orbax checkpoints, the online phase by
iteration):

  tasks           the phone-profile (AitW action space) suites: train tasks for every training episode, test
                  tasks for the evaluation alone
  il              the scripted expert's demonstrations → the VLM trained on them (AutoUI's SFT checkpoint)
  offline_data    the IL actor's judged rollouts on the train tasks at `offline.temperature` (or `data.path`)
  critics         image features of every state; the instruction-level critic V^inst and the step-level double
                  critic V^step trained on the offline data (the code's offline phase, §4.8)
  filtered_bc     the baseline: every step of the top-10 % trajectories by reward, trained from the IL actor
  digirl_offline  the same trajectories' steps whose advantage passes the hard filter, trained from the IL actor
  online          (off2on, online) iterations of: rollouts of the current actor on train tasks → V^inst and
                  V^step continue training on all the data → the actor continues on the steps of the top-10 %
                  trajectories by reward − V^inst with A > 0 (Filtered BC: top-10 % by reward)
  eval            every trained actor on the same held-out test episodes at `eval.temperature`: `results.json`,
                  TensorBoard, a table
"""

from __future__ import annotations

import os
import time
from typing import Sequence

import numpy as np

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.judges import programmatic
from jaxagent.pipeline import async_collect, device, distributed, report, rollout
from jaxagent.pipeline.config import stage_config
from jaxagent.pipeline.policy import inference_mesh
from jaxagent.pipeline.stages import Stages, read_json, write_json, write_text
from jaxagent.pipeline.tasks import draw_episodes, success_rate
from jaxagent.proj.digirl import critics
from jaxagent.rl.losses import AUTOUI_PROB_CLAMP
from jaxagent.serving.checkpoint import load_policy
from jaxagent.train import loop
from jaxagent.train.losses import sequence_nll, weighted_token_nll
from jaxagent.train.metrics import MetricWriter

STAGES = ("tasks", "il", "offline_data", "critics", "filtered_bc", "digirl_offline", "online", "eval")
CHOICES = {
    "env.browser": ("chromium",),
    "model.kind": ("vlm", "autoui"),
    "mode": ("offline", "off2on", "online"),
    "algorithm": ("digirl", "filtered_bc"),
    "demos.split": ("train", "train_a", "train_b"),
    "parse": ("faithful", "lenient"),
    "judge.kind": ("programmatic", "llm"),
    "actor.loss": ("digirl", "token_nll"),
    "actor.advantage": ("code", "dr"),
}


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
  print("\n" + results_table(results))
  print(stages.table())
  return results


# ---------------------------------------------------------------------------------------- helpers


def _judge(config, store_dir: str):
  """The programmatic judge, or DigiRL's per-step LLM evaluator reading screenshots from `store_dir`."""
  if config.judge.kind == "programmatic":
    return None  # `device.rollout`'s programmatic default
  cfg = config.judge.to_dict()
  cfg["llm"] = dict(cfg["llm"], image_root=store_dir)
  return programmatic.make_judge(cfg)


def _rollout(config, model_dir, temperature, tasks, store_dir, name, seed, meta=None):
  actor = device.load_actor(config, model_dir, temperature, seed, parse=str(config.parse))
  return device.rollout(config, device.env_spec(config), actor, tasks, store_dir, name, gamma=float(config.gamma),
                        judge=_judge(config, store_dir), meta=meta)


class Data:
  """Trajectories with their stores and per-state image features, growing as the online phase collects."""

  def __init__(self):
    self.stores: list[TrajectoryStore] = []
    self.trajs: list[types.Trajectory] = []
    self.screens: list[np.ndarray] = []

  def add(self, store: TrajectoryStore, trajs: Sequence[types.Trajectory], screens: Sequence[np.ndarray]):
    keep = [(t, f) for t, f in zip(trajs, screens) if t.steps and t.success is not None]  # errored / unjudged out
    self.stores += [store] * len(keep)
    self.trajs += [t for t, _ in keep]
    self.screens += [f for _, f in keep]

  def step_arrays(self, config, last: int | None = None) -> dict[str, np.ndarray]:
    """The step rows of every trajectory, or of the most recent ones holding about `last` steps (the code's
    FIFO replay buffer of `capacity` transitions)."""
    start = 0
    if last is not None:
      total = 0
      for start in range(len(self.trajs) - 1, -1, -1):
        total += len(self.trajs[start].steps)
        if total >= last:
          break
    arrays = critics.step_arrays(self.trajs[start:], self.screens[start:], int(config.features.text_dim),
                                 float(config.gamma))
    arrays["index"][:, 0] += start
    return arrays

  def samples(self, picks, image_dir: str) -> list[dict]:
    """Training samples of (trajectory i, step k, action, weight) picks, each from its own store."""
    return device.state_samples(list(self.stores), self.trajs, picks, image_dir)


def screen_features(config, workdir: str, store: TrajectoryStore, trajs: Sequence[types.Trajectory],
                    cache: str) -> list[np.ndarray]:
  """[T + 1, D] image features per trajectory (its states, then its final screen), from the IL VLM's vision
  tower, cached in `cache` (an .npz)."""
  if os.path.exists(cache):
    with np.load(cache) as f:
      return [f[str(i)] for i in range(len(trajs))]
  loaded = load_policy(os.path.join(workdir, "il"), mesh=inference_mesh(config))
  shots, spans = [], []
  for t in trajs:
    paths = [s.image_path for s in t.steps] + [t.steps[-1].next_image_path if t.steps else None]
    paths = [p or _nearest(paths, k) for k, p in enumerate(paths)]  # a screen not stored: its nearest neighbour's
    begin = len(shots)
    shots += [store.load_image(p) for p in paths if p]
    spans.append((begin, len(shots)))
  feats = device.screen_features(loaded, shots, int(config.features.batch))
  out = [feats[a:b] for a, b in spans]
  if distributed.is_main():  # every process computed the same features; one writes them
    tmp = f"{cache}.tmp{os.getpid()}.npz"
    np.savez(tmp, **{str(i): f for i, f in enumerate(out)})
    os.replace(tmp, cache)
  return out


def _nearest(paths: Sequence[str | None], k: int) -> str | None:
  return next((paths[j] for j in sorted(range(len(paths)), key=lambda j: (abs(j - k), -j)) if paths[j]), None)


def offline_store(config, workdir: str) -> TrajectoryStore:
  return TrajectoryStore(config.data.path or os.path.join(workdir, "offline_data", "store"))


def offline_data(config, workdir: str) -> Data:
  store = offline_store(config, workdir)
  trajs = rollout.episodes(store)
  data = Data()
  data.add(store, trajs, screen_features(config, workdir, store, trajs, os.path.join(workdir, "critics", "feats.npz")))
  return data


def _critic_models(config, text_dim: int, image_dim: int):
  return (lambda: critics.TrajectoryCritic(text_dim, int(config.traj_critic.hidden), int(config.seed)),
          lambda: critics.StepCritic(text_dim, image_dim, int(config.critic.hidden), int(config.seed) + 1))


def train_critics(config, data: Data, out: str, blocks, start=None) -> tuple[critics.TrajectoryCritic,
                                                                                   critics.StepCritic, dict]:
  """V^inst on every trajectory and V^step on the replay (the last `online.capacity` steps), with the stage blocks
  `blocks` = (traj_critic, critic); `start` = the critics to continue from."""
  text_dim = int(config.features.text_dim)
  traj_rows = critics.trajectory_arrays(data.trajs, text_dim)
  steps = data.step_arrays(config, int(config.online.capacity))
  traj_fn, step_fn = _critic_models(config, text_dim, steps["image"].shape[-1])
  traj_critic = critics.train(stage_config(config, blocks[0], seed_offset=5), os.path.join(out, "traj_critic"),
                              traj_rows, traj_fn, critics.trajectory_critic_loss, start and start[0])
  step_critic = critics.train(stage_config(config, blocks[1], seed_offset=6), os.path.join(out, "step_critic"),
                              steps, step_fn, critics.step_critic_loss, start and start[1])
  v, v_next = critics.step_values(step_critic, steps)
  succ = steps["label"] > 0
  summary = {"trajectories": len(data.trajs), "steps": int(len(v)), "success": success_rate(data.trajs),
             "v_inst_success": _mean(critics.trajectory_values(traj_critic, traj_rows["text"])[traj_rows["label"] > 0]),
             "v_inst_failure": _mean(critics.trajectory_values(traj_critic, traj_rows["text"])[traj_rows["label"] == 0]),
             "v_step_success": _mean(v[succ]), "v_step_failure": _mean(v[~succ])}
  return traj_critic, step_critic, summary


def _mean(x) -> float | None:
  return float(np.mean(x)) if len(x) else None


def restore_critics(config, data: Data, out: str, blocks):
  text_dim = int(config.features.text_dim)
  traj_fn, step_fn = _critic_models(config, text_dim, data.screens[0].shape[-1] * 2)
  return (loop.restore_model(stage_config(config, blocks[0], seed_offset=5), os.path.join(out, "traj_critic"),
                             traj_fn),
          loop.restore_model(stage_config(config, blocks[1], seed_offset=6), os.path.join(out, "step_critic"),
                             step_fn))


def actor_picks(config, data: Data, algorithm: str, keep: np.ndarray, step_critic=None) -> tuple[list, dict]:
  """The actor's (i, k, action, weight) samples from the kept trajectories: every step (Filtered BC) or the steps
  whose advantage passes the hard filter (DigiRL)."""
  arrays = data.step_arrays(config)
  rows = np.flatnonzero(keep[arrays["index"][:, 0]])
  info = {"kept_trajectories": int(keep.sum()), "kept_success": _mean(np.asarray(
      [data.trajs[i].success == 1.0 for i in np.flatnonzero(keep)]))}
  if algorithm == "digirl":
    v, v_next = critics.step_values(step_critic, arrays)
    adv, w = critics.step_weights(v, v_next, arrays, str(config.actor.advantage), float(config.gamma),
                                  int(config.tasks.max_steps))
    rows = rows[w[rows] > 0]
    info["mean_advantage"] = _mean(adv)
  picks = [(int(i), int(k), data.trajs[i].steps[k].action_text, 1.0) for i, k in arrays["index"][rows]
           if data.trajs[i].steps[k].image_path and data.trajs[i].steps[k].action_text]
  info["samples"] = len(picks)
  return picks, info


def train_actor(config, workdir: str, block, data: Data, picks, out: str, init_from: str, seed_offset: int) -> dict:
  """The actor from `init_from` on the picked samples (plus the demonstrations at `actor.il_weight`)."""
  loss = sequence_nll(AUTOUI_PROB_CLAMP) if config.actor.loss == "digirl" else weighted_token_nll
  items = data.samples(picks, os.path.join(out, "images"))
  if not items:
    return {"note": f"no step passed the filter; the actor equals {init_from}"}
  demos = device.finetune_with_demos(stage_config(config, block, seed_offset=seed_offset), workdir, out, items,
                                     float(config.actor.il_weight), init_from, loss)
  return {"trained_on": len(items) + demos}


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


# ------------------------------------------------------------------------------------------ stages


def stage_offline_data(config, workdir, out):
  if config.data.path:
    store = offline_store(config, workdir)
    trajs = rollout.episodes(store)
    if not trajs:
      raise ValueError(f"config.data.path={config.data.path!r} holds no trajectories")
    return {"source": config.data.path, "episodes": len(trajs), "success": success_rate(trajs)}
  tasks = draw_episodes(device.suite(workdir, "train"), int(config.offline.episodes), int(config.seed) + 1, "off")
  trajs = _rollout(config, os.path.join(workdir, "il"), float(config.offline.temperature), tasks,
                   os.path.join(out, "store"), "il_actor@offline", int(config.seed))
  return {"episodes": len(trajs), "success": success_rate(trajs), "steps": sum(len(t.steps) for t in trajs),
          "ended_by_malformed_action": sum(bool(t.steps) and t.steps[-1].action is not None
                                           and t.steps[-1].action.kind == types.ActionKind.IMPOSSIBLE for t in trajs)}


def stage_critics(config, workdir, out):
  data = offline_data(config, workdir)
  return train_critics(config, data, out, (config.traj_critic, config.critic))[2]


def stage_offline_actor(config, workdir, out, algorithm):
  """The offline phase's actor: trained from the IL actor on `filterbc_buffer`'s trajectories (the code's offline
  DigiRL also filters by reward, not V^inst)."""
  data = offline_data(config, workdir)
  keep = critics.filterbc_keep(data.trajs, float(config.actor.quantile))
  step_critic = restore_critics(config, data, os.path.join(workdir, "critics"),
                                (config.traj_critic, config.critic))[1] if algorithm == "digirl" else None
  picks, info = actor_picks(config, data, algorithm, keep, step_critic)
  init = os.path.join(workdir, "il")
  _record_init(out, init)
  info.update(train_actor(config, workdir, config.actor, data, picks, out, init, seed_offset=7))
  return info


def online_episodes(config, workdir, iteration: int) -> list[types.Task]:
  """Iteration `iteration`'s rollouts: a seeded draw of train tasks (the code samples tasks at random)."""
  return draw_episodes(device.suite(workdir, "train"), int(config.online.episodes),
                       int(config.seed) + 100 + iteration, f"on{iteration}.")


def stage_online(config, workdir, out):
  """`online.iterations` rounds of collect → critics → actor (`offpolicy_train_loop`'s online loop); with
  `online.max_lag` > 0 each round's rollouts run while the previous rounds train (`pipeline.async_collect`)."""
  digirl = config.algorithm == "digirl"
  inner = Stages(out, "digirl/online", config)
  blocks = (config.online.traj_critic, config.online.critic)
  if config.mode == "off2on":
    data = offline_data(config, workdir)
    actor = actor_dir(workdir, "digirl_offline" if digirl else "filtered_bc")
    prev_critics = os.path.join(workdir, "critics"), (config.traj_critic, config.critic)
  else:
    data, actor, prev_critics = Data(), os.path.join(workdir, "il"), None
  n, max_lag = int(config.online.iterations), int(config.online.max_lag)
  features: dict[int, list] = {}  # round -> its screen features, computed by the collector once

  def collect(i, behaviour):
    """Round i's rollouts by `behaviour` (the actor `max_lag` updates back at most) and their screen features."""
    o, t0 = inner.dir(f"iter{i}_rollouts"), time.monotonic()
    trajs = _rollout(config, behaviour, float(config.online.temperature), online_episodes(config, workdir, i),
                     os.path.join(o, "store"), f"actor@online{i}", int(config.seed) + 10 + i,
                     meta={"behaviour_actor": behaviour, "policy_lag": collector.lag(i)})
    store = TrajectoryStore(os.path.join(o, "store"))
    features[i] = screen_features(config, workdir, store, rollout.episodes(store), os.path.join(o, "feats.npz"))
    return {"success": success_rate(trajs), "behaviour": behaviour, "lag": collector.lag(i),
            "collect_s": time.monotonic() - t0}

  history = []
  with async_collect.AsyncCollector(collect, n, max_lag, done=lambda i: inner.is_done(f"iter{i}_rollouts")
                                    ) as collector:
    collector.publish(0, actor)
    for i in range(n):
      name = f"iter{i}"
      rollouts = inner.run(f"{name}_rollouts", lambda o, i=i: collector.result(i))
      store = TrajectoryStore(os.path.join(inner.dir(f"{name}_rollouts"), "store"))
      trajs = rollout.episodes(store)
      feats = features.pop(i, None)  # a round finished in an earlier run: read from its cache
      if feats is None:
        feats = screen_features(config, workdir, store, trajs, os.path.join(inner.dir(f"{name}_rollouts"), "feats.npz"))
      data.add(store, trajs, feats)
      if digirl:
        start = restore_critics(config, data, *prev_critics) if prev_critics else None
        inner.run(f"{name}_critics", lambda o, start=start: train_critics(config, data, o, blocks, start)[2])
        prev_critics = inner.dir(f"{name}_critics"), blocks
        traj_critic, step_critic = restore_critics(config, data, *prev_critics)
        v_inst = critics.trajectory_values(traj_critic, critics.trajectory_arrays(
            data.trajs, int(config.features.text_dim))["text"])
        keep = critics.digirl_keep(data.trajs, v_inst, float(config.actor.quantile))
      else:
        step_critic, keep = None, critics.filterbc_keep(data.trajs, float(config.actor.quantile))

      def actor_stage(o, actor=actor, keep=keep, step_critic=step_critic):
        picks, info = actor_picks(config, data, config.algorithm, keep, step_critic)
        _record_init(o, actor)
        return {**info, **train_actor(config, workdir, config.online.actor, data, picks, o, actor, seed_offset=8 + i)}

      info = inner.run(f"{name}_actor", actor_stage)
      actor = actor_dir(out, f"{name}_actor")
      collector.publish(i + 1, actor)
      history.append({"iteration": i, "rollout_success": rollouts["success"], "lag": rollouts.get("lag", 0),
                      **info})
  return {"actor": actor, "iterations": history}


def test_episodes(config, workdir):
  """The evaluation's episodes: `eval.episodes` draws from the held-out test split with the fixed `eval.seed`."""
  return draw_episodes(device.suite(workdir, "test"), int(config.eval.episodes), int(config.eval.seed), "eval")


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


def stage_eval(config, workdir, out):
  results, writer = {}, MetricWriter(out)
  temperature = float(config.eval.temperature)
  for name, model_dir in policies(config, workdir).items():
    trajs = _rollout(config, model_dir, temperature, test_episodes(config, workdir), os.path.join(out, name), name,
                     int(config.eval.seed))
    results[name] = device.eval_summary(trajs, temperature)
    writer.write_scalars(0, {f"eval/{name}_success_rate": results[name]["success_rate"]})
  writer.close()
  if distributed.is_main():
    write_json(os.path.join(workdir, "results.json"), results)
  return results


def results_table(results: dict) -> str:
  return report.policy_table(results)
