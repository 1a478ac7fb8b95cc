"""Grain random-access sources over a `TrajectoryStore`: one record per episode or per step.

A source freezes the store's episode list when it is built, so its length and order stay fixed while
collectors keep appending; build a new source to see new episodes. Order, shuffling and resumption are
Grain's: `grain.MapDataset.source(src).shuffle(seed)` is a deterministic permutation, and the iterator's
`get_state()` / `set_state()` (checkpointed with the model, `reference/jax_stack.md` §4.3) resumes it mid-epoch.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Callable

from jaxagent import types
from jaxagent.data.store import TrajectoryStore

Where = Callable[[types.Trajectory], bool]


class _EpisodeReader:
  """Reads episodes of a store with a small LRU cache (a step source reads each episode many times)."""

  def __init__(self, store: TrajectoryStore | str | os.PathLike, cache_size: int = 32):
    self.store = store if isinstance(store, TrajectoryStore) else TrajectoryStore(store)
    self._cache: collections.OrderedDict[int, types.Trajectory] = collections.OrderedDict()
    self._cache_size = cache_size

  def episode(self, i: int) -> types.Trajectory:
    if i in self._cache:
      self._cache.move_to_end(i)
      return self._cache[i]
    traj = self.store.read(i)
    self._cache[i] = traj
    if len(self._cache) > self._cache_size:
      self._cache.popitem(last=False)
    return traj

  def __getstate__(self):  # a Grain worker gets the path and an empty cache
    return {"store": self.store, "cache_size": self._cache_size}

  def __setstate__(self, state):
    self.__init__(state["store"], state["cache_size"])


class TrajectorySource:
  """Episode `i` of the (filtered) store as a `Trajectory`; `success`/`where` as in `TrajectoryStore.indices`."""

  def __init__(self, store: TrajectoryStore | str | os.PathLike, success: bool | None = None,
               where: Where | None = None):
    self._reader = _EpisodeReader(store, cache_size=1)
    self.episodes = self._reader.store.indices(success, where)

  def __len__(self) -> int:
    return len(self.episodes)

  def __getitem__(self, i: int) -> types.Trajectory:
    return self._reader.episode(self.episodes[i])

  def __repr__(self) -> str:
    return f"TrajectorySource({self._reader.store.path!r}, episodes={len(self)})"


class StepSource:
  """Step `i` of the (filtered) store, with its episode context, as a dict:

    task, step (`Step`), history (the earlier `Step`s of its episode), episode (store index), episode_id,
    step_index, success, trajectory_reward, status; plus `image` / `next_image` (uint8 [H, W, 3] or None)
    when `with_images`.
  """

  def __init__(self, store: TrajectoryStore | str | os.PathLike, success: bool | None = None,
               where: Where | None = None, with_images: bool = False):
    self._reader = _EpisodeReader(store)
    self.with_images = with_images
    self.index: list[tuple[int, int]] = []
    for e, traj in self._reader.store.scan(success, where):
      self.index.extend((e, t) for t in range(len(traj.steps)))

  def __len__(self) -> int:
    return len(self.index)

  def __getitem__(self, i: int) -> dict[str, Any]:
    e, t = self.index[i]
    traj = self._reader.episode(e)
    step = traj.steps[t]
    record = {
        "task": traj.task, "step": step, "history": traj.steps[:t], "episode": e,
        "episode_id": traj.meta.get("episode_id", ""), "step_index": t, "success": traj.success,
        "trajectory_reward": traj.trajectory_reward, "status": traj.status,
    }
    if self.with_images:
      load = self._reader.store.load_image
      record["image"] = load(step.image_path) if step.image_path else None
      record["next_image"] = load(step.next_image_path) if step.next_image_path else None
    return record

  def __repr__(self) -> str:
    return f"StepSource({self._reader.store.path!r}, steps={len(self)})"
