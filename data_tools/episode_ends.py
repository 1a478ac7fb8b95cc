"""How a run's evaluated policies ended their episodes, per global seed: a success (the judge's 1), a negative
reward (a wrong end, e.g. MiniWoB++'s −1), out of time (MiniWoB++'s page clock ended it: −1 with the reason "timed
out", only where the page's clock was kept), out of steps (status `truncated`), or anything else (a partial
reward, a stop without one). A policy that maximises a return in which running out of steps (0) beats a wrong end (−1) can
raise its return without its success: this shows it.

  python data_tools/episode_ends.py /work/runs/grpo            # every policy under seed<k>/eval/
  python data_tools/episode_ends.py /work/runs/grpo --policies il,grpo
"""

from __future__ import annotations

import argparse
import collections
import os

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import rollout
from jaxagent.pipeline.seeds import seed_workdirs

ENDS = ("success", "negative", "out_of_time", "out_of_steps", "other")


def end_of(traj: types.Trajectory) -> str:
  if traj.success == 1.0:
    return "success"
  if traj.steps and traj.steps[-1].info.get("reason") == "timed out":  # the page's clock, not the policy's answer
    return "out_of_time"
  if traj.trajectory_reward < 0:
    return "negative"
  return "out_of_steps" if traj.status == "truncated" else "other"


def ends(workdir: str, policies: list[str] | None = None) -> dict[int, dict[str, dict[str, int]]]:
  """seed → policy → end → episodes, from each `seed<k>/eval/<policy>` store of a multi-seed `workdir` (or the
  workdir's own `eval/` as seed -1)."""
  roots = seed_workdirs(workdir) or {-1: workdir}
  out = {}
  for seed, root in sorted(roots.items()):
    names = policies or sorted(n for n in os.listdir(os.path.join(root, "eval"))
                               if os.path.isdir(os.path.join(root, "eval", n)))
    out[seed] = {}
    for name in names:
      path = os.path.join(root, "eval", name)
      if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no evaluation store of policy {name!r}")
      counts = collections.Counter(map(end_of, rollout.episodes(TrajectoryStore(path))))
      out[seed][name] = {e: counts.get(e, 0) for e in ENDS}
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("workdir")
  ap.add_argument("--policies", default="", help="comma-separated; default every store under eval/")
  args = ap.parse_args(argv)
  table = ends(args.workdir, [p for p in args.policies.split(",") if p] or None)
  print(f"{'seed':>4}  {'policy':<16}" + "".join(f"{e:>14}" for e in ENDS))
  for seed, by_policy in table.items():
    for name, counts in by_policy.items():
      print(f"{seed:>4}  {name:<16}" + "".join(f"{counts[e]:>14}" for e in ENDS))
  return table


if __name__ == "__main__":
  main()
