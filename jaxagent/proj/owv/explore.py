"""Exploration and feedback (`reference/algorithms.md` §2.4): roll tasks out through the pool, judge each
trajectory, rerun the failed tasks (at most `max_attempts` attempts per task), keep the first success.

    for rerun in 0..max_attempts-1:      # exploration_feedback.py, max_rerun_times = 5
      roll out every still-unsolved task once (episode id `<task id>#run<rerun>`, the original's
      `task{id}--run{rerun}`), judge it; a success removes the task from the next round

Every episode goes to one `TrajectoryStore`; an episode already there (a killed run) is not run again, and the
rounds are recomputed from the store, so a restarted exploration continues where it stopped.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.policies import history_with_images

RoundFn = Callable[[int, Sequence[types.Task]], Sequence[types.Trajectory]]


def attempt_id(task_id: str, attempt: int) -> str:
  return f"{task_id}#run{attempt}"


@dataclasses.dataclass
class ExploreResult:
  solved: dict[str, types.Trajectory]  # task id → its first successful trajectory
  attempts: dict[str, int]  # task id → attempts used (≤ max_attempts)
  episodes: int

  def summary(self, n_tasks: int) -> dict:
    first = sum(1 for tid in self.solved if self.attempts[tid] == 1)
    return {"tasks": n_tasks, "solved": len(self.solved), "solved_rate": len(self.solved) / max(n_tasks, 1),
            "first_attempt_rate": first / max(n_tasks, 1), "episodes": self.episodes,
            "mean_attempts": float(np.mean(list(self.attempts.values()))) if self.attempts else 0.0}


def explore(tasks: Sequence[types.Task], max_attempts: int, run_round: RoundFn) -> ExploreResult:
  """Retry-until-success: `run_round(k, pending)` returns one judged trajectory per pending task (attempt k);
  tasks whose trajectory succeeded (`success == 1.0`) are solved and not run again."""
  if max_attempts < 1:
    raise ValueError(f"config.explore.max_attempts={max_attempts} must be >= 1 (the paper uses 5)")
  pending = list(tasks)
  solved: dict[str, types.Trajectory] = {}
  attempts: dict[str, int] = {}
  episodes = 0
  for k in range(max_attempts):
    if not pending:
      break
    trajs = run_round(k, pending)
    if len(trajs) != len(pending):
      raise RuntimeError(f"exploration round {k}: {len(trajs)} trajectories for {len(pending)} tasks")
    episodes += len(trajs)
    still = []
    for task, traj in zip(pending, trajs):
      attempts[task.id] = k + 1
      if traj.success == 1.0:
        solved[task.id] = traj
      else:
        still.append(task)
    pending = still
  return ExploreResult(solved, attempts, episodes)


class ReferencedJudge:
  """The configured judge, with the programmatic verdict recorded beside it (`meta["programmatic_success"]`)
  when the two differ in kind, so an LLM judge's agreement with the evaluators can be measured (§1.5)."""

  def __init__(self, judge: types.Judge, reference: types.Judge | None = None):
    self.judge, self.reference = judge, reference

  def evaluate(self, task: types.Task, trajectory: types.Trajectory) -> types.Verdict:
    # The collector judges before the store writes screenshots: hand an LLM judge the in-memory ones.
    shown = dataclasses.replace(trajectory, steps=history_with_images(trajectory.steps))
    verdict = self.judge.evaluate(task, shown)
    if self.reference is not None:
      trajectory.meta["programmatic_success"] = self.reference.evaluate(task, trajectory).success
    return verdict


def agreement(trajs: Sequence[types.Trajectory]) -> dict | None:
  """Agreement of the judge's verdicts with the programmatic ones (None without a reference)."""
  pairs = [(t.success, t.meta["programmatic_success"]) for t in trajs
           if "programmatic_success" in t.meta and t.success is not None and t.meta["programmatic_success"] is not None]
  if not pairs:
    return None
  a = np.asarray(pairs, np.float64) >= 0.5
  return {"judged": len(pairs), "agreement": float((a[:, 0] == a[:, 1]).mean()),
          "judge_positive": float(a[:, 0].mean()), "programmatic_positive": float(a[:, 1].mean())}


def explore_rollouts(rollouts, policy, tasks: Sequence[types.Task], store: TrajectoryStore, judge: types.Judge,
                     max_attempts: int, name: str, meta: dict | None = None) -> ExploreResult:
  """`explore` with each attempt one `pipeline.rollout.Rollouts.run` (episode ids `attempt_id(task, k)`, so a
  restarted exploration finds its finished attempts in `store`); solved/attempts keyed by the query's own id;
  `meta` goes into every trajectory's meta."""

  def run_round(k, pending):
    return rollouts.run(policy, [dataclasses.replace(t, id=attempt_id(t.id, k)) for t in pending], store,
                        judge=judge, name=name, meta=meta)

  return explore(tasks, max_attempts, run_round)
