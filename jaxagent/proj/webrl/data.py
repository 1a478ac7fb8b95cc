"""WebRL's training rows from stored trajectories (`scripts/process_data.py:build_policy_data`, §3.5).

A step's state is its prompt (`obs_text`: the WebRL prompt it was acting on), its action the raw reply, its next
state the next step's prompt; the last step's is a new round with its reply in the history over the page it saw
(`build_policy_data` passes the last trace line as its own next observation and `template` formats it at index
+ 1), so V(s') − V(s) is the critic's verdict on the last reply. Its reward is the trajectory's score repeated on
every step, and its Monte Carlo return `add_mc_return`'s Σ_k γ^(k−t) r with γ = 0.9, so G_t > 0 iff the trajectory
succeeded. The episodes are read from the run's stores (the demonstrations, each phase's rollouts); `actor_steps`
sizes the actor's training on the samples.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from jaxagent import types
from jaxagent.agents.webrl import MAX_PROMPT_CHARS, compact_html, current_html, webrl_prompt
from jaxagent.data import copy_augment
from jaxagent.data.conversation import step_samples, text_sample as sample  # noqa: F401  (WebRL's names)
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import rollout

GAMMA = 0.9  # process_data.py: add_mc_return(t, gamma=0.9)


def sft_samples(trajs: Sequence[types.Trajectory], copies: int = 0, seed: int = 0) -> list[dict]:
  """The solved demonstrations' steps as SFT samples, then `copies` of each with the strings it types or answers
  made up (`data.copy_augment`; 0 = the original's samples alone)."""
  solved = [t for t in trajs if t.success == 1.0]
  return step_samples(solved) + copy_augment.copies(solved, copies, seed)


def cut_html(prompt: str, chars: int) -> str:
  """`prompt` (a `webrl_prompt`) with its current round's HTML cut to its first `chars` characters: the instruction,
  the history and the reply unchanged, the page short (the SFT warm-up's samples)."""
  html = current_html(prompt)
  if not html:
    return prompt
  head = prompt.rfind(html)
  return prompt[:head] + html[:chars] + prompt[head + len(html):]


def mc_returns(n: int, reward: float, gamma: float = GAMMA) -> np.ndarray:
  """G_t = Σ_{k ≥ t} γ^(k−t) r for the reward r repeated on each of n steps (`add_mc_return`)."""
  return (reward * (1.0 - gamma ** np.arange(n, 0, -1, dtype=np.float64)) / (1.0 - gamma)).astype(np.float32)


def usable(traj: types.Trajectory) -> bool:
  """A trajectory the learners read: it ran, and every step has a prompt and a reply."""
  return traj.status != "errored" and bool(traj.steps) and all(s.obs_text and s.action_text for s in traj.steps)


def judged(trajs: Sequence[types.Trajectory]) -> list[types.Trajectory]:
  """The episodes with a programmatic verdict (a generated task has none)."""
  return [x for x in trajs if x.success is not None]


def final_state(traj: types.Trajectory, compact: bool = False, max_chars: int = MAX_PROMPT_CHARS) -> str:
  """The state after an episode's last step, as `build_policy_data` builds it: round T with every reply in the
  history, over the last step's page (its stored observation's HTML, through `compact_html` with `compact`, cut
  as the prompts are at `max_chars`; without one, the page its prompt carries)."""
  last = traj.steps[-1]
  obs = last.observation
  if obs is not None and obs.html:
    html = compact_html(obs.html) if compact else obs.html
  else:
    html = current_html(last.obs_text)
  return webrl_prompt(traj.task.intent, [s.action_text for s in traj.steps], html, max_chars)


def row_options(config) -> dict:
  """`step_rows`' prompt options, those the actors' prompts were built with (`html`, `prompt_chars`)."""
  return {"compact": config.html == "compact", "max_chars": int(config.prompt_chars)}


def step_rows(trajs: Sequence[types.Trajectory], rewards: Sequence[float], gamma: float = GAMMA,
              compact: bool = False, max_chars: int = MAX_PROMPT_CHARS) -> dict:
  """One row per step: `state` and `next_state` prompts (the last step's `final_state`, built with `compact` and
  `max_chars`), `action`, `reward`, `mc_return`, `task` (the intent) and `index` (trajectory, step)."""
  rows = {k: [] for k in ("state", "next_state", "action", "reward", "mc_return", "task", "index")}
  for i, (traj, r) in enumerate(zip(trajs, rewards)):
    steps = traj.steps
    g = mc_returns(len(steps), float(r), gamma)
    for k, step in enumerate(steps):
      rows["state"].append(step.obs_text)
      rows["next_state"].append(steps[k + 1].obs_text if k + 1 < len(steps) else final_state(traj, compact, max_chars))
      rows["action"].append(step.action_text)
      rows["reward"].append(float(r))
      rows["mc_return"].append(float(g[k]))
      rows["task"].append(traj.task.intent)
      rows["index"].append((i, k))
  for k in ("reward", "mc_return"):
    rows[k] = np.asarray(rows[k], np.float32)
  rows["index"] = np.asarray(rows["index"], np.int32).reshape(-1, 2)
  return rows


def demos(workdir: str) -> list[types.Trajectory]:
  """The scripted expert's demonstrations, as the `sft` stage stored them."""
  return rollout.episodes(TrajectoryStore(os.path.join(workdir, "sft", "demos")))


def phase_episodes(workdir: str, t: int) -> list[types.Trajectory]:
  """Phase t's usable rollouts."""
  return [x for x in rollout.episodes(TrajectoryStore(os.path.join(workdir, f"phase{t}", "rollouts", "store")))
          if usable(x)]


def score_options(config) -> dict:
  """`pipeline.scoring.score`'s batch and length for every model the run scores with (ORM, trunk, π_ref)."""
  return {"batch": int(config.scoring.batch), "max_len": int(config.data.seq_len)}


def actor_steps(config, samples: int) -> int:
  """`actor.train.steps`, capped at `actor.epochs` passes over the phase's `samples` (the original trains one
  epoch): a phase whose critic filter left a few tasks does not fit their steps dozens of times over."""
  per_epoch = samples / int(config.actor.train.batch_size)
  return max(1, min(int(config.actor.train.steps), math.ceil(float(config.actor.epochs) * per_epoch)))
