"""DigiRL's training data: judged trajectories with the image features of their screens, the critics' inputs and
the actor's samples (`reference/algorithms.md` §4.6–4.8). Offline it is one store; online it grows by a store a
round, the replay the critics read."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import device, distributed, rollout
from jaxagent.pipeline.policy import inference_mesh
from jaxagent.proj.digirl import critics
from jaxagent.serving.checkpoint import load_policy


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

  def step_arrays(self, config, last: int = 0) -> dict[str, np.ndarray]:
    """The step rows of every trajectory in the order they were added, or (`last` > 0) the newest `last` rows:
    the code's replay buffer of `capacity` transitions, a FIFO that overwrites the oldest. Rows are built from
    whole trajectories, so a trajectory the cap cuts keeps its frame stack."""
    start = 0
    if last > 0:
      total = 0
      for start in range(len(self.trajs) - 1, -1, -1):
        total += len(self.trajs[start].steps)
        if total >= last:
          break
    arrays = critics.step_arrays(self.trajs[start:], self.screens[start:], int(config.features.text_dim),
                                 float(config.gamma), device.actor_format(config))
    arrays["index"][:, 0] += start
    return {k: v[-last:] for k, v in arrays.items()} if 0 < last < len(arrays["index"]) else arrays

  def samples(self, picks, image_dir: str, text: bool = False) -> list[dict]:
    """Training samples of (trajectory i, step k, action, weight) picks, each from its own store (`text`: the
    states' prompts alone)."""
    return device.state_samples(list(self.stores), self.trajs, picks, image_dir, text)


def load_store(config, model_dir: str, store_dir: str, cache: str) -> tuple[TrajectoryStore, list[types.Trajectory],
                                                                          list[np.ndarray]]:
  """The episodes in `store_dir` and their screen features (`screen_features`): what `Data.add` takes."""
  store = TrajectoryStore(store_dir)
  trajs = rollout.episodes(store)
  return store, trajs, screen_features(config, model_dir, store, trajs, cache)


def screen_features(config, model_dir: str, store: TrajectoryStore, trajs: Sequence[types.Trajectory],
                    cache: str) -> list[np.ndarray]:
  """[T + 1, D] image features per trajectory (its states, then its final screen), from the vision tower of the
  VLM in `model_dir` (the IL actor's), cached in `cache` (an .npz) so a resumed run does not encode them again.
  A text observation has no screen apart from its prompt: [T + 1, 0] (the critics read the page in `text`)."""
  if device.reads_text(config):
    return [np.zeros((len(t.steps) + 1, 0), np.float32) for t in trajs]
  if os.path.exists(cache):
    with np.load(cache) as f:
      return [f[str(i)] for i in range(len(trajs))]
  loaded = load_policy(model_dir, mesh=inference_mesh(config))
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
  """The stored path nearest to position k, the later one on a tie."""
  return next((paths[j] for j in sorted(range(len(paths)), key=lambda j: (abs(j - k), -j)) if paths[j]), None)
