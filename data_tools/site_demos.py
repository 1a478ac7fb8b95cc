"""Demonstrations: the scripted expert run through the collector on the bundled sites, saved for imitation learning.

  python data_tools/site_demos.py --out DIR --format openwebvoyager --profile web --limit 200 --workers 4

writes `DIR/store/` (a `TrajectoryStore` of every episode, successes and failures, with screenshots; each episode is
stored as it ends, and a rerun into the same DIR runs only the tasks not stored yet) and, for
OpenWebVoyager, the IL recipe's inputs: `DIR/owv_il.json` (conversation samples of the successful episodes,
`agents.openwebvoyager.trajectory_to_samples`) and `DIR/images/<flag>--stepNN.png`. This replaces the GPT-4o
teacher trajectories of `reference/algorithms.md` §2.3 with the oracle's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from typing import Any, Sequence

from jaxagent.agents import openwebvoyager
from jaxagent.data.store import TrajectoryStore
from jaxagent.envs.pool import EnvPool
from jaxagent.envs.sites import expert as expert_lib
from jaxagent.envs.sites import server, tasks as tasks_lib
from jaxagent.judges import evaluators
from jaxagent.pipeline.rollout import episodes, stored_ids
from jaxagent.rl.collector import collect
from jaxagent.types import Task


def _record_observation_text(traj) -> None:
  """Keeps what the OpenWebVoyager converter reads from each step: the a11y tree and the feedback shown."""
  for s in traj.steps:
    if s.observation is not None:
      s.info["a11y_tree"] = s.observation.a11y_tree
      s.info["error"] = s.observation.error


def make_demos(tasks: Sequence[Task], out_dir: str, format_name: str = "openwebvoyager", profile: str = "web",
               workers: int = 2, epsilon: float = 0.0, stop_prob: float = 0.0, seed: int = 0,
               base_url: str | None = None) -> dict[str, Any]:
  tasks = [t for t in tasks if t.profile == profile]
  if not tasks:
    raise ValueError(f"no tasks of profile {profile!r} given")
  if epsilon or stop_prob:
    policy = expert_lib.NoisyExpert(format_name, epsilon=epsilon, stop_prob=stop_prob, seed=seed)
  else:
    policy = expert_lib.ScriptedExpert(format_name)
  # One server in this process for all workers: the state stays readable after the pool is gone.
  spec = {"kind": "jaxagent.envs.sites.env:SiteEnv", "profile": profile,
          "observation": expert_lib.FORMAT_OBSERVATION[format_name], "oracle_targets": True,
          "base_url": base_url or server.ensure_server(tasks[0].seed)}
  store = TrajectoryStore(os.path.join(out_dir, "store"))
  todo = [t for t in tasks if t.id not in stored_ids(store)]
  if todo:
    with EnvPool(spec, num_workers=workers, step_timeout=120, reset_timeout=120) as pool:
      collect(pool, policy, policy.fmt.parse, todo, store=store, judge=evaluators.ProgrammaticJudge(),
              progress=False, policy_name=f"scripted_expert:{format_name}", keep_screenshots=False,
              prepare=_record_observation_text)
  by_id = {t.task.id: t for t in episodes(store, errored=True)}
  trajs = [by_id[t.id] for t in tasks if t.id in by_id]
  samples: list[dict[str, Any]] = []
  for traj in trajs:
    if format_name == "openwebvoyager" and traj.success == 1.0 and all(s.image_path for s in traj.steps):
      flag = traj.task.id.replace("/", "_")
      samples.extend(openwebvoyager.trajectory_to_samples(traj, flag))
      openwebvoyager.copy_images(traj, flag, store.path, os.path.join(out_dir, "images"))
  summary = {"episodes": len(trajs), "successes": sum(t.success == 1.0 for t in trajs),
             "store": store.path, "samples": len(samples)}
  if format_name == "openwebvoyager":
    summary["il_file"] = os.path.join(out_dir, "owv_il.json")
    with open(summary["il_file"], "w") as f:
      json.dump(samples, f, ensure_ascii=False, indent=1)
  return summary


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True)
  parser.add_argument("--profile", choices=tasks_lib.PROFILES, default="web")
  parser.add_argument("--format", default="openwebvoyager")
  parser.add_argument("--split", default="train")
  parser.add_argument("--limit", type=int, default=100)
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--epsilon", type=float, default=0.0)
  parser.add_argument("--stop-prob", type=float, default=0.0)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  suite = [t for t in tasks_lib.generate(args.seed)[args.split] if t.profile == args.profile]
  random.Random(args.seed).shuffle(suite)
  print(json.dumps(make_demos(suite[:args.limit], args.out, args.format, args.profile, args.workers, args.epsilon,
                              args.stop_prob, args.seed), indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
