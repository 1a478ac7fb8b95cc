"""Resumable rollouts: tasks through an `EnvPool`, judged, into a `TrajectoryStore`.

An episode's id is its task's id; an episode already in the store (a killed run) is kept and not run again, so
a rerun of a rollout continues where the last one stopped. The exception is an episode stored `errored` (its
browser crashed on every retry): a rerun runs it again, up to `config.env.errored_retries` times, appending a new
record; readers take the last record of each id (`episodes`). The pool (one browser per worker) starts only when
there is something left to run.

Under `jax.distributed` each process runs its share of the tasks (`distributed.shard`: task i on process
i % count) into a store of its own, `<store>/shard<k>/`, so no two processes ever append to one log (an
append-only log needs a lock a shared filesystem may not give). Readers (`stored_by_id`, `episodes`,
`stored_ids`, `errored_counts`) see the union of the store and its shards, screenshots' paths made relative to
the store, and in task order: process 0 lists each rollout's task ids in `<store>/order.txt` (the order of a
resumed or sharded run is then the uninterrupted single-process one), ids it does not list come after, in the
order they first appear.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable, Iterator, Sequence

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.envs.backends import make_pool
from jaxagent.envs.pool import EnvPool
from jaxagent.envs.sites import server
from jaxagent.pipeline import distributed
from jaxagent.pipeline.stages import write_text
from jaxagent.rl.collector import Job, collect_jobs

ORDER = "order.txt"  # the task ids of the store's rollouts, one a line, in task order
_SHARD = re.compile(r"shard(\d+)")


# config.env.browser -> the env that renders the bundled sites
BROWSERS = {"chromium": "jaxagent.envs.sites.env:SiteEnv", "text": "jaxagent.envs.sites.text_env:SiteTextEnv"}


def site_env(profile: str, observation: str, world_seed: int = 0, env=None, **options) -> dict[str, Any]:
  """The `EnvPool` spec of the bundled sites (`profile`: web | device | text) served for `world_seed`, on
  loopback or on `env.sites_address` (`config.env`: an address a Ray fleet's machines reach)."""
  host = (env.get("sites_address", "") if env is not None else "") or "127.0.0.1"
  browser = env.get("browser", "chromium") if env is not None else "chromium"
  if browser not in BROWSERS:
    raise ValueError(f"config.env.browser={browser!r} is not one of {tuple(BROWSERS)}")
  if browser == "text" and observation != "html":
    raise ValueError(f"config.env.browser='text' renders the simplified HTML only, not observation={observation!r}; "
                     "set --config.env.browser=chromium")
  return {"kind": BROWSERS[browser], "profile": profile, "observation": observation,
          "base_url": server.ensure_server(int(world_seed), host), **options}


def shard_dir(store_path: str, index: int) -> str:
  """Process `index`'s part of the store at `store_path` in a multi-process run."""
  return os.path.join(store_path, f"shard{index}")


def shards(store_path: str) -> list[str]:
  """The names of the shard directories under `store_path` that hold episodes, by process index."""
  if not os.path.isdir(store_path):
    return []
  found = [(int(m.group(1)), name) for name in os.listdir(store_path) if (m := _SHARD.fullmatch(name))
           and os.path.exists(os.path.join(store_path, name, "episodes.jsonl"))]
  return [name for _, name in sorted(found)]


def _parts(store: TrajectoryStore) -> Iterator[tuple[str, TrajectoryStore]]:
  """(path prefix, store) of the store itself, then of each shard."""
  store.refresh()
  yield "", store
  for name in shards(store.path):
    yield f"{name}/", TrajectoryStore(os.path.join(store.path, name))


def _records(store: TrajectoryStore) -> Iterator[dict[str, Any]]:
  for _, part in _parts(store):
    for i in range(len(part)):
      yield part.read_json(i)


def read_order(store_path: str) -> list[str]:
  path = os.path.join(store_path, ORDER)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [line.rstrip("\n") for line in f if line.strip()]


def record_order(store_path: str, ids: Sequence[str]) -> None:
  """Adds the ids `ORDER` does not list yet at its end (atomically; call it on one process)."""
  listed = read_order(store_path)
  new = [i for i in dict.fromkeys(ids) if i not in set(listed)]
  if new:
    os.makedirs(store_path, exist_ok=True)
    write_text(os.path.join(store_path, ORDER), "".join(f"{i}\n" for i in listed + new))


def task_order(ids: Sequence[str], listed: Sequence[str]) -> list[str]:
  """`ids` (first-appearance order) sorted: those in `listed` in its order, then the others as they came."""
  rank = {i: k for k, i in enumerate(listed)}
  return sorted(dict.fromkeys(ids), key=lambda i: rank.get(i, len(rank)))  # stable: unlisted keep their order


def stored_ids(store: TrajectoryStore) -> set[str]:
  """The episode ids `store` (and its shards) hold, read from the records alone, no screenshots."""
  return {record["task"]["id"] for record in _records(store)}


def errored_counts(store: TrajectoryStore) -> dict[str, int]:
  """Per episode id whose last record is `errored`: how many errored records it has."""
  counts: dict[str, int] = {}
  for record in _records(store):
    episode = record["task"]["id"]
    counts[episode] = counts.get(episode, 0) + 1 if record.get("status") == "errored" else 0
  return {k: n for k, n in counts.items() if n}


def _rebased(traj: types.Trajectory, prefix: str) -> types.Trajectory:
  """A shard's episode with its screenshot paths relative to the store above the shard (`store.load_image`)."""
  if prefix:
    for step in traj.steps:
      step.image_path = prefix + step.image_path if step.image_path else step.image_path
      step.next_image_path = prefix + step.next_image_path if step.next_image_path else step.next_image_path
  return traj


def stored_by_id(store: TrajectoryStore) -> dict[str, types.Trajectory]:
  """The last record of each episode id (a retried errored episode's newest attempt) of the store and its
  shards, in task order (see the module doc)."""
  last: dict[str, types.Trajectory] = {}
  for prefix, part in _parts(store):
    for traj in part:
      last[traj.task.id] = _rebased(traj, prefix)
  return {i: last[i] for i in task_order(list(last), read_order(store.path))}


def episodes(store: TrajectoryStore, errored: bool = False) -> list[types.Trajectory]:
  """The store's episodes for training readers: the last record of each id, in task order (`stored_by_id`);
  without `errored`, those whose browser crashed on every retry are left out (no verdict, partial steps)."""
  return [t for t in stored_by_id(store).values() if errored or t.status != "errored"]


class Rollouts:
  """A pool of `env_spec` environments, started on first need and shared by every `run` in the `with` block.

  `env`: `config.env` (`workers`, `step_timeout`, `reset_timeout`, `backend`, `ray_address`: see `make_pool`).
  """

  def __init__(self, env_spec: dict[str, Any], env, progress: bool = False):
    self.spec, self.env, self.progress = env_spec, env, bool(progress)
    self.pool: EnvPool | None = None

  def __enter__(self) -> "Rollouts":
    return self

  def __exit__(self, *exc) -> None:
    if self.pool is not None:
      self.pool.close()
      self.pool = None

  def _pool(self, n_tasks: int) -> EnvPool:
    if self.pool is None:
      self.pool = make_pool(self.spec, self.env, num_workers=max(1, min(int(self.env.workers), n_tasks)))
    return self.pool

  def run(self, policy: types.Policy, tasks: Sequence[types.Task], store: str | TrajectoryStore, *,
          judge: types.Judge | None, name: str, gamma: float = 1.0, parse: Callable[[str], types.Action] | None = None,
          obs_text=None, process: tuple[int, int] | None = None, meta: dict | None = None,
          early_stop: Callable[[list[types.Step]], str] | None = None) -> list[types.Trajectory]:
    """Every task once (those not yet in `store`), judged; all of `tasks`' trajectories, in task order. Under
    `jax.distributed` this process runs its share into its shard of `store`, and every process returns all of
    them once all have finished (a barrier: call it on every process).

    `parse` defaults to the policy's agent format (`policy.fmt.parse`); `obs_text` to that format's observation
    text (see `rl.collector.collect`); `process` = (index, count) to run as (default: this JAX process's); `meta`
    is added to every new trajectory's `meta` (e.g. the behaviour policy's version and lag); `early_stop` ends an
    episode early when it gives a reason (`rl.collector.collect`)."""
    job = Job(policy, tasks, parse, store, gamma, judge, obs_text, name, keep_screenshots=False,
              prepare=(lambda traj: traj.meta.update(meta)) if meta else None, early_stop=early_stop)
    return self.run_jobs([job], process)[0]

  def run_jobs(self, jobs: Sequence[Job], process: tuple[int, int] | None = None) -> list[list[types.Trajectory]]:
    """`run` for several policies in one scheduling (`rl.collector.collect_jobs`): each job's `store` (a path or
    a `TrajectoryStore`) keeps its episodes and resumes them as `run` does; its `policy` may be a loader called
    when its first episode starts. Returns each job's trajectories."""
    index, count = process or (distributed.process_index(), distributed.process_count())
    stores, todo_jobs = [], []
    for job in jobs:
      store = job.store if isinstance(job.store, TrajectoryStore) else TrajectoryStore(job.store)
      have, errored = stored_ids(store), errored_counts(store)
      budget = 1 + int(self.env.get("errored_retries", 0))
      todo = [t for t in distributed.shard(job.tasks, index, count)
              if t.id not in have or 0 < errored.get(t.id, 0) < budget]
      if index == 0:
        record_order(store.path, [t.id for t in job.tasks])
      if todo:
        writer = store if count == 1 else TrajectoryStore(shard_dir(store.path, index))
        todo_jobs.append(dataclasses.replace(job, tasks=todo, store=writer))
      stores.append(store)
    if todo_jobs:
      collect_jobs(self._pool(sum(len(j.tasks) for j in todo_jobs)), todo_jobs, self.progress)
    names = ", ".join(job.policy_name for job in jobs)
    distributed.barrier(f"rollouts {names} into {os.path.basename(stores[0].path) if stores else ''}")
    out = []
    for job, store in zip(jobs, stores):
      by_id = stored_by_id(store)
      out.append([by_id[t.id] for t in job.tasks if t.id in by_id])
    return out


def rollout(env_spec: dict[str, Any], env, policy: types.Policy, tasks: Sequence[types.Task],
            store: str | TrajectoryStore, *, progress: bool = False, **kwargs) -> list[types.Trajectory]:
  """One `Rollouts.run` in a pool of its own (see there)."""
  with Rollouts(env_spec, env, progress) as r:
    return r.run(policy, tasks, store, **kwargs)
