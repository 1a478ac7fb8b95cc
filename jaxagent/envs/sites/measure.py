"""Measures the scripted (or noisy) expert's success rate on a suite, through real Chromium, judged by the evaluators.

  python -m jaxagent.envs.sites expert --profile web --format webvoyager --workers 2 --json web.json
  python -m jaxagent.envs.sites expert --profile device --format autoui --epsilon 0.2 --stop-prob 0.05 --limit 100

Each worker process runs its own site server and browser; tasks are split among them.
"""

from __future__ import annotations

import collections
import multiprocessing
import time
from typing import Any

from jaxagent.types import Task

_worker: dict[str, Any] = {}


def _init(profile: str, format_name: str, epsilon: float, stop_prob: float, seed: int) -> None:
  from jaxagent.envs.sites import env as env_lib, expert  # noqa: PLC0415 (in the worker)
  if epsilon or stop_prob:
    policy = expert.NoisyExpert(format_name, epsilon=epsilon, stop_prob=stop_prob,
                                seed=seed * 1000 + multiprocessing.current_process()._identity[0])  # per worker
  else:
    policy = expert.ScriptedExpert(format_name)
  _worker["env"] = env_lib.SiteEnv(profile=profile, observation=expert.FORMAT_OBSERVATION[format_name],
                                   oracle_targets=True)
  _worker["policy"] = policy


def _run(task_json: dict[str, Any]) -> dict[str, Any]:
  from jaxagent.envs.sites import expert  # noqa: PLC0415
  from jaxagent.judges import evaluators  # noqa: PLC0415
  task = Task.from_json(task_json)
  t0 = time.time()
  try:
    traj = expert.run_episode(_worker["env"], _worker["policy"], task)
    verdict = evaluators.evaluate(task, traj)
    return {"id": task.id, "template": task.template, "success": verdict.success, "reason": verdict.reason,
            "steps": len(traj.steps), "seconds": time.time() - t0}
  except Exception as e:  # pylint: disable=broad-except  # a crash is a failure, recorded, not lost
    return {"id": task.id, "template": task.template, "success": 0.0, "reason": f"error: {e!r}", "steps": 0,
            "seconds": time.time() - t0}


def measure(tasks: list[Task], profile: str, format_name: str, workers: int = 2, epsilon: float = 0.0,
            stop_prob: float = 0.0, seed: int = 0) -> dict[str, Any]:
  t0 = time.time()
  ctx = multiprocessing.get_context("spawn")
  with ctx.Pool(workers, initializer=_init, initargs=(profile, format_name, epsilon, stop_prob, seed)) as pool:
    results = pool.map(_run, [t.to_json() for t in tasks], chunksize=1)
  by_template: dict[str, list[float]] = collections.defaultdict(list)
  for r in results:
    by_template[r["template"]].append(float(r["success"] or 0.0))
  n_ok = sum(float(r["success"] or 0.0) for r in results)
  return {"profile": profile, "format": format_name, "epsilon": epsilon, "stop_prob": stop_prob,
          "tasks": len(results), "successes": n_ok, "success_rate": n_ok / max(1, len(results)),
          "by_template": {k: sum(v) / len(v) for k, v in sorted(by_template.items())},
          "mean_steps": sum(r["steps"] for r in results) / max(1, len(results)),
          "wall_seconds": time.time() - t0,
          "failures": [r for r in results if r["success"] != 1.0]}
