"""WebRL's replay buffer with the actor-confidence filter (§3.9; `scripts/process_data.py:replay_data`).

Past phases' successful trajectories (the SFT demonstrations first) give their steps, the first success of each
task within each of `replay.chunks` strided chunks of them (the original dedups inside each of its 8 GPU workers'
chunks `file_contents[i::8]`, so a task gives up to 8); a step is replayed when the current actor's
geometric-mean token probability of its action (`rl.losses.webrl_rank_score`, 1/perplexity) lies in (0.5, 0.95];
the kept steps are shuffled and cut at twice the current phase's step count, then join every current-phase step.
An episode's reward is the ORM's label (or, with `reward=judge`, the judge's verdict); a demonstration's is the
judge's.
"""

from __future__ import annotations

import os
import random
from typing import Sequence

import numpy as np

from jaxagent import types
from jaxagent.pipeline import scoring
from jaxagent.pipeline.policy import inference_mesh
from jaxagent.pipeline.stages import read_json
from jaxagent.proj.webrl import data
from jaxagent.rl import losses
from jaxagent.serving.checkpoint import load_policy

RANK_BAND = (0.5, 0.95)
CAP = 2  # kept replay steps ≤ CAP × current phase steps
CHUNKS = 8  # replay_data's num_processes: its worker chunks


def first_per_task(tasks: Sequence[str], success: Sequence[bool], chunks: int = CHUNKS) -> list[int]:
  """Indices of the successful trajectories kept: in each strided chunk `i::chunks` (`replay_data`'s
  `file_contents[i::num_processes]`), the first one of each task (intent); chunk 0's first, as the original
  concatenates its workers' outputs. `chunks=1`: the first success of each task overall."""
  if chunks < 1:
    raise ValueError(f"config.replay.chunks={chunks!r}: must be >= 1")
  out = []
  for c in range(chunks):
    seen = set()
    for i in range(c, len(tasks), chunks):
      if success[i] and tasks[i] not in seen:
        seen.add(tasks[i])
        out.append(i)
  return out


def rank_scores(logp: np.ndarray, tokens: np.ndarray) -> np.ndarray:
  """exp(Σ_t log π(a_t|s) / n) per step from the summed log-probability and the token count
  (`rl.losses.webrl_rank_score` of the per-token form)."""
  return np.exp(np.asarray(logp, np.float64) / np.maximum(np.asarray(tokens), 1)).astype(np.float32)


def select(scores: np.ndarray, current_steps: int, seed: int, band: tuple[float, float] = RANK_BAND,
           cap: int = CAP) -> np.ndarray:
  """Indices of the replayed steps: those whose score passes the band, shuffled, at most `cap × current_steps`."""
  keep = np.flatnonzero(np.asarray(losses.perplexity_replay_filter(np.asarray(scores), *band)))
  order = list(keep)
  random.Random(seed).shuffle(order)
  return np.asarray(order[:cap * int(current_steps)], np.int64)


def rewards(config, trajs: Sequence[types.Trajectory], labels: dict) -> list[float]:
  """Each episode's reward: the ORM's label 1[p ≥ 0.5] (WebRL), or the judge's verdict (`reward=judge`)."""
  if config.reward == "judge":
    return [float(x.success == 1.0) for x in trajs]
  return [float(labels[x.task.id] >= 0.5) for x in trajs]


def phase_rewards(config, workdir: str, t: int, trajs: Sequence[types.Trajectory]) -> list[float]:
  """`rewards` of phase t's episodes from the ORM's labels its `labels` stage wrote."""
  return rewards(config, trajs, read_json(os.path.join(workdir, f"phase{t}", "labels", "orm.json")))


def history(config, workdir: str, t: int) -> dict:
  """The replay candidates: every earlier phase's (and the demonstrations') steps of successful episodes, the
  first successful episode of each task in each of `replay.chunks` chunks (`replay_data`), as step rows."""
  trajs = [x for x in data.demos(workdir) if data.usable(x)]
  reward = [float(x.success == 1.0) for x in trajs]
  for k in range(1, t):
    past = data.phase_episodes(workdir, k)
    trajs += past
    reward += phase_rewards(config, workdir, k, past)
  keep = first_per_task([x.task.intent for x in trajs], [r >= 0.5 for r in reward], int(config.replay.chunks))
  return data.step_rows([trajs[i] for i in keep], [reward[i] for i in keep], **data.row_options(config))


def actor_samples(config, rows: dict, history_rows: dict, reference: str, seed: int
                  ) -> tuple[list[dict], list[int], dict]:
  """The actor's candidate samples (this phase's steps, then the replay candidates), the indices it trains on
  (every phase step, then the replayed: `select` over `rank_scores` under π_ref = `reference`, in `replay.low`
  to `replay.high`, at most `replay.cap` × the phase's steps), and π_ref's scores of every sample."""
  states, actions = rows["state"] + history_rows["state"], rows["action"] + history_rows["action"]
  items = [data.sample(f"s{i}", s, a) for i, (s, a) in enumerate(zip(states, actions))]
  ref = scoring.score(load_policy(reference, mesh=inference_mesh(config)), items, **data.score_options(config))
  n_now = len(rows["state"])
  ranks = rank_scores(ref["logp"][n_now:], ref["tokens"][n_now:])
  replayed = select(ranks, n_now, seed, (float(config.replay.low), float(config.replay.high)), int(config.replay.cap))
  return items, list(range(n_now)) + [n_now + int(i) for i in replayed], ref
