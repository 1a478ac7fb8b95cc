"""Transition-row helpers shared by the offline critics of DigiRL and Digi-Q (`reference/algorithms.md` §4, §5).

Rows are one transition each, keyed by (trajectory index, step index). Both originals load their offline
trajectories the same way in `digi{rl,q}/algorithms/offpolicy_train_loop.py`: `framestack` gives each state the
previous screen's image features beside its own, and the first 80 % of the trajectories fill the replay buffer
that trains, the rest a validation buffer.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def frame_stack(rows: np.ndarray, image: np.ndarray, next_image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(s, s') image features with the previous screen stacked in front: s = [f_{t−1} ‖ f_t], s' = [f_t ‖ f_{t+1}].

  `rows` [M, 2] = (trajectory, step); `image` [M, D] = f_t and `next_image` [M, D] = f_{t+1} of each row.
  f_{t−1} is the `image` of row (i, t − 1). Where there is no such row the current screen is repeated: the
  original's rule for the first step, f_{−1} := f_0 (`offpolicy_train_loop.py:framestack`); a later step whose
  predecessor has no row (no screenshot) is treated as a first step. Returns two [M, 2D] arrays.
  """
  rows = np.asarray(rows).reshape(-1, 2)
  image, next_image = np.asarray(image), np.asarray(next_image)
  if not len(rows) == len(image) == len(next_image):
    raise ValueError(f"frame_stack: {len(rows)} rows but {len(image)} image and {len(next_image)} next_image rows")
  where = {(int(i), int(k)): r for r, (i, k) in enumerate(rows)}
  if len(where) != len(rows):
    raise ValueError("frame_stack: rows repeat a (trajectory, step) pair; each transition needs one row")
  previous = np.asarray([where.get((int(i), int(k) - 1), r) for r, (i, k) in enumerate(rows)], np.int64)
  previous = previous.reshape(-1)
  return (np.concatenate([image[previous], image], axis=-1),
          np.concatenate([image, next_image], axis=-1))


def held_out_trajectories(trajectory_ids: Sequence[int], val_fraction: float, seed: int) -> np.ndarray:
  """The trajectories of `trajectory_ids` (distinct) kept out of training: all but the first
  ⌊n (1 − val_fraction)⌋ of a permutation drawn with `seed`.

  The originals keep the first int(0.8 n) trajectories in file order for training and the rest for validation;
  the permutation makes the held-out set independent of the order the rollouts were stored in.
  """
  if not 0.0 <= val_fraction < 1.0:
    raise ValueError(f"val_fraction={val_fraction} must lie in [0, 1)")
  ids = np.unique(np.asarray(trajectory_ids, np.int64))
  n_train = int(len(ids) * (1.0 - val_fraction))
  return np.sort(np.random.default_rng(seed).permutation(ids)[n_train:])
