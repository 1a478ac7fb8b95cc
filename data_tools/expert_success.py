"""Measures the scripted (or noisy) expert's success rate on a suite, through real Chromium, judged by the evaluators.

  python data_tools/expert_success.py --profile web --format webvoyager --workers 2 --json web.json
  python data_tools/expert_success.py --profile device --format autoui --epsilon 0.2 --stop-prob 0.05 --limit 100
  python data_tools/expert_success.py --bench device/headline@2 --format autoui --per-family 15   # the benchmark

Each worker process runs its own site server and browser; tasks are split among them.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import random
import sys
import time
from typing import Any, Sequence

from jaxagent.envs.sites import bench
from jaxagent.envs.sites import env as env_lib
from jaxagent.envs.sites import expert
from jaxagent.envs.sites import tasks as tasks_lib
from jaxagent.judges import evaluators
from jaxagent.types import Task

_worker: dict[str, Any] = {}


def _init(profile: str, format_name: str, epsilon: float, stop_prob: float, seed: int, shortcut: float = 0.0) -> None:
  if epsilon or stop_prob or shortcut:
    policy = expert.NoisyExpert(format_name, epsilon=epsilon, stop_prob=stop_prob, shortcut=shortcut,
                                seed=seed * 1000 + multiprocessing.current_process()._identity[0])  # per worker
  else:
    policy = expert.ScriptedExpert(format_name)
  _worker["env"] = env_lib.SiteEnv(profile=profile, observation=expert.FORMAT_OBSERVATION[format_name],
                                   oracle_targets=True)
  _worker["policy"] = policy


def _run(task_json: dict[str, Any]) -> dict[str, Any]:
  task = Task.from_json(task_json)
  t0 = time.time()
  try:
    traj = expert.run_episode(_worker["env"], _worker["policy"], task)
    verdict = evaluators.evaluate(task, traj)
    out = {"id": task.id, "template": task.template, "success": verdict.success, "reason": verdict.reason,
           "steps": len(traj.steps), "seconds": time.time() - t0}
    if verdict.success != 1.0:  # what happened, for the failure list
      out["trace"] = [f"{s.url.split('/s/', 1)[-1]} | {s.action_text[:120]} | {s.info.get('error', '')}"
                      for s in traj.steps]
    return out
  except Exception as e:  # pylint: disable=broad-except  # a crash is a failure, recorded, not lost
    return {"id": task.id, "template": task.template, "success": 0.0, "reason": f"error: {e!r}", "steps": 0,
            "seconds": time.time() - t0}


def measure(tasks: list[Task], profile: str, format_name: str, workers: int = 2, epsilon: float = 0.0,
            stop_prob: float = 0.0, seed: int = 0, shortcut: float = 0.0) -> dict[str, Any]:
  t0 = time.time()
  ctx = multiprocessing.get_context("spawn")
  with ctx.Pool(workers, initializer=_init, initargs=(profile, format_name, epsilon, stop_prob, seed, shortcut)) as pool:
    results = pool.map(_run, [t.to_json() for t in tasks], chunksize=1)
  by_template: dict[str, list[float]] = collections.defaultdict(list)
  for r in results:
    by_template[r["template"]].append(float(r["success"] or 0.0))
  n_ok = sum(float(r["success"] or 0.0) for r in results)
  return {"profile": profile, "format": format_name, "epsilon": epsilon, "stop_prob": stop_prob, "shortcut": shortcut,
          "tasks": len(results), "successes": n_ok, "success_rate": n_ok / max(1, len(results)),
          "by_template": {k: sum(v) / len(v) for k, v in sorted(by_template.items())},
          "mean_steps": sum(r["steps"] for r in results) / max(1, len(results)),
          "wall_seconds": time.time() - t0,
          "failures": [r for r in results if r["success"] != 1.0]}


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--profile", choices=tasks_lib.PROFILES, default="web")
  parser.add_argument("--format", default="webvoyager",
                      help="agent format: webvoyager, openwebvoyager, webrl, autoui ...")
  parser.add_argument("--split", default="test")
  parser.add_argument("--tasks", default="", help="a task JSONL file instead of the generated suite")
  parser.add_argument("--bench", default="", help="a benchmark split, PROFILE/SPLIT[@LEVEL][/FAMILIES] (e.g. "
                      "device/headline@2), instead of the generated suite; sets --profile")
  parser.add_argument("--per-family", type=int, default=0, help="with --bench: the first N tasks of each family")
  parser.add_argument("--limit", type=int, default=0, help="first N tasks of a seeded shuffle (0 = all)")
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--epsilon", type=float, default=0.0)
  parser.add_argument("--stop-prob", type=float, default=0.0)
  parser.add_argument("--shortcut", type=float, default=0.0, help="noisy: take a perturbed episode's deal with "
                      "this probability")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default="", help="write the full result here")
  args = parser.parse_args(argv)
  if args.bench:
    args.profile = bench.parse_split(args.bench)[0]
    suite = bench.tasks_for(args.bench, args.seed)
    if args.per_family:
      seen: dict[str, int] = collections.Counter()
      suite = [t for t in suite if (seen.update([t.meta["family"]]) or seen[t.meta["family"]]) <= args.per_family]
  else:
    suite = tasks_lib.load_tasks(args.tasks) if args.tasks else tasks_lib.generate(args.seed)[args.split]
  suite = [t for t in suite if t.profile == args.profile]
  if args.limit:
    random.Random(args.seed).shuffle(suite)
    suite = suite[:args.limit]
  result = measure(suite, args.profile, args.format, args.workers, args.epsilon, args.stop_prob, args.seed,
                   args.shortcut)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=1)
  summary = {k: v for k, v in result.items() if k != "failures"}
  summary["failures"] = [f"{r['id']}: {r['reason'][:160]}" for r in result["failures"][:20]]
  print(json.dumps(summary, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
