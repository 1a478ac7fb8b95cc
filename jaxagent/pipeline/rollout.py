"""Resumable rollouts: tasks through an `EnvPool`, judged, into a `TrajectoryStore`.

An episode's id is its task's id; an episode already in the store (a killed run) is kept and not run again, so
a rerun of a rollout continues where the last one stopped. The exception is an episode stored `errored` (its
browser crashed on every retry): a rerun runs it again, up to `config.env.errored_retries` times, appending a new
record; readers take the last record of each id (`episodes`). The pool (one browser per worker) starts only when
there is something left to run.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.envs.pool import EnvPool
from jaxagent.envs.sites import server
from jaxagent.rl.collector import collect


def site_env(profile: str, observation: str, world_seed: int = 0, **options) -> dict[str, Any]:
  """The `EnvPool` spec of the bundled sites (`profile`: web | device | text) served for `world_seed`."""
  return {"kind": "jaxagent.envs.sites.env:SiteEnv", "profile": profile, "observation": observation,
          "base_url": server.ensure_server(int(world_seed)), **options}


def stored_ids(store: TrajectoryStore) -> set[str]:
  """The episode ids `store` holds (read from the records alone, no screenshots)."""
  store.refresh()
  return {store.read_json(i)["task"]["id"] for i in range(len(store))}


def errored_counts(store: TrajectoryStore) -> dict[str, int]:
  """Per episode id whose last record is `errored`: how many errored records it has."""
  store.refresh()
  counts: dict[str, int] = {}
  for i in range(len(store)):
    record = store.read_json(i)
    episode = record["task"]["id"]
    counts[episode] = counts.get(episode, 0) + 1 if record.get("status") == "errored" else 0
  return {k: n for k, n in counts.items() if n}


def stored_by_id(store: TrajectoryStore) -> dict[str, types.Trajectory]:
  """The last record of each episode id (a retried errored episode's newest attempt)."""
  store.refresh()
  return {t.task.id: t for t in store}


def episodes(store: TrajectoryStore, errored: bool = False) -> list[types.Trajectory]:
  """The store's episodes for training readers: the last record of each id, in the order ids first appear;
  without `errored`, those whose browser crashed on every retry are left out (no verdict, partial steps)."""
  return [t for t in stored_by_id(store).values() if errored or t.status != "errored"]


class Rollouts:
  """A pool of `env_spec` environments, started on first need and shared by every `run` in the `with` block.

  `env`: `config.env` (`workers`, `step_timeout`, `reset_timeout`).
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
      self.pool = EnvPool(self.spec, num_workers=max(1, min(int(self.env.workers), n_tasks)),
                          step_timeout=float(self.env.step_timeout), reset_timeout=float(self.env.reset_timeout))
    return self.pool

  def run(self, policy: types.Policy, tasks: Sequence[types.Task], store: str | TrajectoryStore, *,
          judge: types.Judge | None, name: str, gamma: float = 1.0, parse: Callable[[str], types.Action] | None = None,
          obs_text=None) -> list[types.Trajectory]:
    """Every task once (those not yet in `store`), judged; all of `tasks`' trajectories, in task order.

    `parse` defaults to the policy's agent format (`policy.fmt.parse`); `obs_text` to that format's observation
    text (see `rl.collector.collect`)."""
    store = store if isinstance(store, TrajectoryStore) else TrajectoryStore(store)
    have, errored = stored_ids(store), errored_counts(store)
    budget = 1 + int(self.env.get("errored_retries", 0))
    todo = [t for t in tasks if t.id not in have or 0 < errored.get(t.id, 0) < budget]
    if todo:
      collect(self._pool(len(todo)), policy, parse or policy.fmt.parse, todo, store=store, judge=judge,
              gamma=gamma, obs_text=obs_text, progress=self.progress, policy_name=name, keep_screenshots=False)
    by_id = stored_by_id(store)
    return [by_id[t.id] for t in tasks if t.id in by_id]


def rollout(env_spec: dict[str, Any], env, policy: types.Policy, tasks: Sequence[types.Task],
            store: str | TrajectoryStore, *, progress: bool = False, **kwargs) -> list[types.Trajectory]:
  """One `Rollouts.run` in a pool of its own (see there)."""
  with Rollouts(env_spec, env, progress) as r:
    return r.run(policy, tasks, store, **kwargs)
