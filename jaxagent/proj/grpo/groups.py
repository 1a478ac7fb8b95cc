"""Groups of rollouts from identical resets, and each step's advantage within its group.

A round draws tasks and plays each `group_size` times from the same reset (the same task and episode seed, so the
same start state); an episode's id is `<task id>@r<round>g<k>`. The advantage of every step of a rollout is its
group-relative return (`rl.losses.grpo_advantages`: GRPO, or Dr. GRPO's unnormalised form), plus with GiGPO a
step-level term over the steps of the group that act on the same state (`rl.losses.gigpo_step_advantages`; the
anchor is the step's prompt text, the observation as the policy read it).

The rewards a group compares (`REWARDS`): `env`, the environment's own (MiniWoB++: +1 success, a partial or
negative reward for a wrong end, 0 for running out of steps), or `success`, the judge's outcome (1 or 0) at the episode's
last step: the binary outcome reward of WebRL, DigiRL and verl-agent, under which running out the step budget is
no better than a wrong end.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxagent import types
from jaxagent.rl import losses
from jaxagent.rl.returns import mc_return

ADVANTAGES = ("grpo", "dr_grpo", "gigpo")
REWARDS = ("env", "success")


def group_episodes(tasks: Sequence[types.Task], group_size: int, round_index: int) -> list[types.Task]:
  """Each task `group_size` times in a row, with ids `<id>@r<round>g<k>`: the same reset, distinct episodes."""
  return [dataclasses.replace(t, id=f"{t.id}@r{round_index}g{k}") for t in tasks for k in range(group_size)]


def group_of(episode_id: str) -> str:
  """The group an episode belongs to: its id without the `g<k>` member suffix."""
  return episode_id.rsplit("g", 1)[0]


def step_rewards(traj: types.Trajectory, reward: str = "env") -> np.ndarray:
  """Each step's reward under `reward` (`REWARDS`): the environment's, or the judge's success at the last step."""
  if reward == "env":
    return np.array([s.reward for s in traj.steps], np.float32)
  if reward != "success":
    raise ValueError(f"reward={reward!r} is not one of {REWARDS}")
  out = np.zeros(len(traj.steps), np.float32)
  if len(out):
    out[-1] = float(traj.success or 0.0)
  return out


def episode_return(traj: types.Trajectory, reward: str = "env") -> float:
  """The return a group compares: the episode's rewards summed (MiniWoB's `env`: its final reward); an errored
  episode has none (it is left out of its group)."""
  return float(step_rewards(traj, reward).sum())


def identical_resets(trajs: Sequence[types.Trajectory]) -> float:
  """The fraction of groups whose members all read the same first prompt (the check that a group shares its
  reset); groups with one usable member count as identical."""
  first: dict[str, set[str]] = {}
  for t in trajs:
    if t.steps:
      first.setdefault(group_of(t.task.id), set()).add(t.steps[0].obs_text)
  return float(np.mean([len(v) == 1 for v in first.values()])) if first else 1.0


def step_advantages(trajs: Sequence[types.Trajectory], kind: str = "grpo", gamma: float = 0.95,
                    step_weight: float = 1.0, reward: str = "env") -> list[np.ndarray]:
  """One advantage per step of each trajectory (in order); errored or empty episodes get an empty array.

  grpo: (R − mean) / (std + ε) within the group; dr_grpo: R − mean; gigpo: grpo's episode term plus
  `step_weight` × the step-level term on γ-discounted returns from each step, grouped by identical prompts.
  `reward`: the rewards compared (`step_rewards`).
  """
  if kind not in ADVANTAGES:
    raise ValueError(f"advantage={kind!r} is not one of {ADVANTAGES}")
  usable = [i for i, t in enumerate(trajs) if t.steps and t.status != "errored"]
  out = [np.zeros(0, np.float32) for _ in trajs]
  if not usable:
    return out
  groups = {g: k for k, g in enumerate(dict.fromkeys(group_of(trajs[i].task.id) for i in usable))}
  ids = np.array([groups[group_of(trajs[i].task.id)] for i in usable], np.int32)
  returns = np.array([episode_return(trajs[i], reward) for i in usable], np.float32)
  episode = np.asarray(losses.grpo_advantages(returns, ids, len(groups), "none" if kind == "dr_grpo" else "std"))
  if kind != "gigpo":
    for i, a in zip(usable, episode):
      out[i] = np.full(len(trajs[i].steps), a, np.float32)
    return out
  anchors: dict[tuple[int, str], int] = {}
  step_ids, step_returns, owner = [], [], []
  for i, g in zip(usable, ids):
    steps = trajs[i].steps
    for s, ret in zip(steps, mc_return(step_rewards(trajs[i], reward), gamma)):
      step_ids.append(anchors.setdefault((int(g), s.obs_text), len(anchors)))
      step_returns.append(float(ret))
      owner.append(i)
  step_adv = np.asarray(losses.gigpo_step_advantages(np.array(step_returns, np.float32), np.array(step_ids),
                                                    len(anchors)))
  episode_of = dict(zip(usable, episode))
  total = np.asarray(losses.gigpo_advantages(np.array([episode_of[i] for i in owner], np.float32), step_adv,
                                             step_weight))
  for i in usable:
    out[i] = total[np.array(owner) == i]
  return out
