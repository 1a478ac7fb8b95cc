"""WebRL's replay buffer with the actor-confidence filter (§3.9; `scripts/process_data.py:replay_data`).

Past phases' successful trajectories (the SFT demonstrations first), one per task (the first seen), give their
steps; a step is replayed when the current actor's geometric-mean token probability of its action
(`rl.losses.webrl_rank_score`, 1/perplexity) lies in (0.5, 0.95]; the kept steps are shuffled and cut at twice
the current phase's step count, then join every current-phase step.
"""

from __future__ import annotations

import random
from typing import Sequence

import numpy as np

from jaxagent.rl import losses

RANK_BAND = (0.5, 0.95)
CAP = 2  # kept replay steps ≤ CAP × current phase steps


def first_per_task(tasks: Sequence[str], success: Sequence[bool]) -> list[int]:
  """Indices of the successful trajectories kept: the first one of each task (intent), in order."""
  seen, out = set(), []
  for i, (task, ok) in enumerate(zip(tasks, success)):
    if ok and task not in seen:
      seen.add(task)
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
