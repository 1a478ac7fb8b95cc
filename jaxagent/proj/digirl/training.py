"""DigiRL's learning on its data (`reference/algorithms.md` §4.7–4.8): the two critics trained (or continued) on
the trajectories and the replay, the trajectories the actor keeps, and the actor's samples from them."""

from __future__ import annotations

import os

import numpy as np

from jaxagent.pipeline import device
from jaxagent.pipeline.config import stage_config
from jaxagent.pipeline.tasks import success_rate
from jaxagent.proj.digirl import critics
from jaxagent.proj.digirl.data import Data
from jaxagent.train import loop


def train_critics(config, data: Data, out: str, blocks, start=None) -> tuple[critics.TrajectoryCritic,
                                                                                   critics.StepCritic, dict]:
  """V^inst on every trajectory and V^step on the replay (the newest `capacity` steps), with the stage blocks
  `blocks` = (traj_critic, critic); `start` = the critics to continue from."""
  text_dim = int(config.features.text_dim)
  traj_rows = critics.trajectory_arrays(data.trajs, text_dim)
  steps = data.step_arrays(config, int(config.capacity))
  traj_fn, step_fn = _critic_models(config, text_dim, steps["image"].shape[-1])
  traj_critic = critics.train(stage_config(config, blocks[0], seed_offset=5), os.path.join(out, "traj_critic"),
                              traj_rows, traj_fn, critics.trajectory_critic_loss, start and start[0])
  step_critic = critics.train(stage_config(config, blocks[1], seed_offset=6), os.path.join(out, "step_critic"),
                              steps, step_fn, critics.step_critic_loss, start and start[1])
  v_inst, traj_succ = critics.trajectory_values(traj_critic, traj_rows["text"]), traj_rows["label"] > 0
  v, _ = critics.step_values(step_critic, steps)
  succ = steps["label"] > 0
  summary = {"trajectories": len(data.trajs), "steps": int(len(v)), "success": success_rate(data.trajs),
             "v_inst_success": _mean(v_inst[traj_succ]), "v_inst_failure": _mean(v_inst[~traj_succ]),
             "v_step_success": _mean(v[succ]), "v_step_failure": _mean(v[~succ])}
  return traj_critic, step_critic, summary


def restore_critics(config, data: Data, out: str, blocks) -> tuple[critics.TrajectoryCritic, critics.StepCritic]:
  """The critics `train_critics` wrote to `out` with the same `blocks`."""
  text_dim = int(config.features.text_dim)
  traj_fn, step_fn = _critic_models(config, text_dim, data.screens[0].shape[-1] * 2)
  return (loop.restore_model(stage_config(config, blocks[0], seed_offset=5), os.path.join(out, "traj_critic"),
                             traj_fn),
          loop.restore_model(stage_config(config, blocks[1], seed_offset=6), os.path.join(out, "step_critic"),
                             step_fn))


def _critic_models(config, text_dim: int, image_dim: int):
  return (lambda: critics.TrajectoryCritic(text_dim, int(config.traj_critic.hidden), int(config.seed)),
          lambda: critics.StepCritic(text_dim, image_dim, int(config.critic.hidden), int(config.seed) + 1))


def online_keep(config, data: Data, traj_critic: critics.TrajectoryCritic | None) -> np.ndarray:
  """The trajectories an online round's actor trains on: the top quantile by reward − V^inst (DigiRL), or by
  reward alone without a critic (Filtered BC)."""
  if traj_critic is None:
    return critics.filterbc_keep(data.trajs, float(config.actor.quantile))
  v_inst = critics.trajectory_values(traj_critic, critics.trajectory_arrays(
      data.trajs, int(config.features.text_dim))["text"])
  return critics.digirl_keep(data.trajs, v_inst, float(config.actor.quantile))


def actor_picks(config, data: Data, algorithm: str, keep: np.ndarray, step_critic=None) -> tuple[list, dict]:
  """The actor's (i, k, action, weight) samples from the filtered buffer, the newest `capacity` steps of the kept
  trajectories in the order they came (`filter_buffer` fills a fresh FIFO of `capacity` transitions): every step
  (Filtered BC) or the steps whose advantage passes the hard filter (DigiRL)."""
  arrays = data.step_arrays(config)
  rows = np.flatnonzero(keep[arrays["index"][:, 0]])
  rows = rows[-int(config.capacity):] if int(config.capacity) > 0 else rows
  info = {"kept_trajectories": int(keep.sum()), "kept_success": _mean(np.asarray(
      [data.trajs[i].success == 1.0 for i in np.flatnonzero(keep)])), "buffer_steps": int(len(rows))}
  if algorithm == "digirl":
    v, v_next = critics.step_values(step_critic, arrays)
    adv, w = critics.step_weights(v, v_next, arrays, str(config.actor.advantage), float(config.gamma),
                                  int(config.tasks.max_steps))
    rows = rows[w[rows] > 0]
    info["mean_advantage"] = _mean(adv)
  text = device.reads_text(config)
  picks = [(int(i), int(k), data.trajs[i].steps[k].action_text, 1.0) for i, k in arrays["index"][rows]
           if device.has_state(data.trajs[i].steps[k], text)]
  info["samples"] = len(picks)
  return picks, info


def _mean(x) -> float | None:
  return float(np.mean(x)) if len(x) else None
