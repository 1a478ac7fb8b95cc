"""The benchmark's tabular separation check and its baseline table, on the sites' link graph (no browser).

  python data_tools/bench_check.py --level 2 --episodes 1600 --json check.json

1. Behaviour data: the goal-aware noisy policy (`linkgraph.NoisyLinkPolicy`) on `train_b` intents of every family,
   each intent once with its own episode seed (the negative control's 8 `train_b` pairs repeated to a share
   like the others').
2. Tabular IL, Filtered BC, greedy Q and Best-of-N (`jaxagent.rl.tabular`) from those episodes.
3. Every policy, the scripted expert, the noisy policy and a uniform random policy on the headline's intents
   (test_comb ∪ test_value ∪ test_template), each intent once, the same episode (seed) for every policy; and on
   the negative control's 8 test pairs, each with `--control-episodes` episode seeds.

The margins the benchmark promises (fixed before any neural run, docs/benchmark.md): on the headline at level 2
Q − FBC ≥ 10 points and FBC − IL ≥ 10; on the negative control |Q − FBC| ≤ 3.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import random
import sys
import time
from typing import Any, Sequence

from jaxagent.envs.sites import bench, linkgraph
from jaxagent.envs.sites.perturb import episode_seed
from jaxagent.judges.evaluators import ProgrammaticJudge, rubric_score
from jaxagent.rl import tabular
from jaxagent.types import Task

POLICIES = ("expert", "noisy", "random", "il", "fbc", "q", "bon")


class Recorder:
  """Wraps a link-level policy and keeps each step's (abstract state, abstract action)."""

  def __init__(self, policy):
    self.policy, self.steps = policy, []

  def begin(self, env):
    self.policy.begin(env)
    self.goal, self.checks = tabular.goal_of(env.task), tabular.state_checks(env.task.evaluator)
    self.steps = []

  def act(self, env, acts, rng):
    act = self.policy.act(env, acts, rng)
    self.steps.append(tabular.Transition(tabular.abstract_state(env, self.goal, self.checks),
                                         tabular.abstract_action(act, self.goal)))
    return act


def judge(episode: linkgraph.Episode) -> tuple[float, float | None]:
  j = ProgrammaticJudge(fetch_state=lambda _: episode.state)
  return float(j.evaluate(episode.task, episode.trajectory).success or 0.0), rubric_score(
      j.rubric(episode.task, episode.trajectory))


def tagged(task: Task, tag: str) -> Task:
  return dataclasses.replace(task, id=f"{task.id}@{tag}")


def behaviour_tasks(train_b: Sequence[Task], n: int, seed: int) -> list[Task]:
  """`n` episodes spread evenly over the families' train_b intents (each intent at most once, but the control's 8
  pairs repeated), each with its own episode id."""
  by_family: dict[str, list[Task]] = collections.defaultdict(list)
  for t in train_b:
    by_family[t.meta["family"]].append(t)
  per = max(1, n // len(by_family))
  rng = random.Random(f"behaviour/{seed}")
  out = []
  for family, pool in sorted(by_family.items()):
    picked = [pool[k % len(pool)] for k in range(per)] if len(pool) < per else rng.sample(pool, per)
    out += [tagged(t, f"b{k}") for k, t in enumerate(picked)]
  return out


def play(env, policy, tasks: Sequence[Task], seed: int) -> list[dict[str, Any]]:
  rows = []
  for task in tasks:
    ep = linkgraph.run(env, policy, task, seed=episode_seed(task.id, seed))
    success, rubric = judge(ep)
    rows.append({"task": task.id, "family": task.meta["family"], "tier": task.meta["tier"], "success": success,
                 "rubric": rubric, "steps": len(ep.steps)})
  return rows


def summarise(rows: Sequence[dict[str, Any]], key: str = "family") -> dict[str, dict[str, float]]:
  groups: dict[str, list[dict]] = collections.defaultdict(list)
  for r in rows:
    groups[str(r[key])].append(r)
    groups["all"].append(r)
  return {g: {"n": len(rs), "success": 100 * sum(r["success"] for r in rs) / len(rs),
              "steps": sum(r["steps"] for r in rs) / len(rs)} for g, rs in sorted(groups.items())}


def floors(level: int, n: int, seed: int = 0, profile: str = "device") -> dict[str, dict[str, float]]:
  """The uniform random policy per tier on `n` train_c intents (a floor: more intents than the headline holds)."""
  pool = bench.generate(seed, profile, level, splits=("train_c",))["train_c"]
  picked = random.Random(f"floor/{seed}").sample(pool, min(n, len(pool)))
  return summarise(play(linkgraph.LinkEnv(seed), linkgraph.RandomLinkPolicy(), picked, seed), "tier")


def check(level: int = 2, episodes: int = 1600, control_episodes: int = 25, seed: int = 0, epsilon: float = 0.3,
          stop_prob: float = 0.02, shortcut: float = 0.5, log=print) -> dict[str, Any]:
  t0 = time.time()
  suite = bench.generate(seed, "web", level, splits=("train_b",) + bench.HEADLINE)
  headline = [tagged(t, "eval") for t in bench.headline(suite)]
  control = [tagged(t, f"eval{k}") for t in suite["test_comb"] if t.meta["family"] == bench.CONTROL
             for k in range(control_episodes)]
  env = linkgraph.LinkEnv(seed)
  recorder = Recorder(linkgraph.NoisyLinkPolicy(epsilon, stop_prob, shortcut))
  tables = tabular.Tables()
  data = behaviour_tasks(suite["train_b"], episodes, seed)
  successes = collections.Counter()
  for k, task in enumerate(data):
    ep = linkgraph.run(env, recorder, task, seed=k)
    success, _ = judge(ep)
    successes[task.meta["family"], success] += 1
    tables.add(recorder.steps, success)
  log(f"behaviour: {len(data)} episodes, {sum(v for (f, s), v in successes.items() if s)} successes "
      f"({time.time() - t0:.0f} s)")
  policies = {"expert": linkgraph.LinkExpert(), "noisy": linkgraph.NoisyLinkPolicy(epsilon, stop_prob, shortcut),
              "random": linkgraph.RandomLinkPolicy(),
              **{m: tabular.TabularActor(tables, m) for m in tabular.TabularActor.MODES}}
  results: dict[str, Any] = {"level": level, "seed": seed, "behaviour": {
      "episodes": len(data), "epsilon": epsilon, "stop_prob": stop_prob, "shortcut": shortcut,
      "success_by_family": {f: 100 * successes[f, 1.0] / max(1, successes[f, 1.0] + successes[f, 0.0])
                            for f in sorted({f for f, _ in successes})}},
      "headline": {}, "control": {}, "tier": {}}
  for name, policy in policies.items():
    rows = play(env, policy, headline, seed)
    results["headline"][name] = summarise(rows)
    results["tier"][name] = summarise(rows, "tier")
    results["control"][name] = summarise(play(env, policy, control, seed))["all"]
    log(f"{name:7s} headline {results['headline'][name]['all']['success']:5.1f} %  "
        f"control {results['control'][name]['success']:5.1f} %  ({time.time() - t0:.0f} s)")
  h, c = results["headline"], results["control"]
  results["margins"] = {"q_minus_fbc": h["q"]["all"]["success"] - h["fbc"]["all"]["success"],
                        "fbc_minus_il": h["fbc"]["all"]["success"] - h["il"]["all"]["success"],
                        "control_q_minus_fbc": c["q"]["success"] - c["fbc"]["success"]}
  results["seconds"] = time.time() - t0
  return results


def markdown(results: dict[str, Any]) -> str:
  fams = [f for f in results["headline"]["expert"] if f != "all"]
  lines = ["| policy | " + " | ".join(fams) + " | headline | control |", "|---" * (len(fams) + 3) + "|"]
  for name in POLICIES:
    h = results["headline"][name]
    lines.append(f"| {name} | " + " | ".join(f"{h[f]['success']:.0f}" for f in fams)
                 + f" | **{h['all']['success']:.1f}** | {results['control'][name]['success']:.1f} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--level", type=int, default=2)
  p.add_argument("--episodes", type=int, default=1600, help="behaviour episodes")
  p.add_argument("--control-episodes", type=int, default=25)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--random", type=int, default=0, help="also the random policy's floor per tier on this many "
                 "train_c intents of the device profile")
  p.add_argument("--json", default="", help="write the results here")
  args = p.parse_args(argv)
  results = check(args.level, args.episodes, args.control_episodes, args.seed)
  if args.random:
    results["random_floor"] = floors(args.level, args.random, args.seed)
    print("random floor (device, train_c):", {k: f"{v['success']:.2f} % of {v['n']}"
                                              for k, v in results["random_floor"].items()})
  print(markdown(results))
  print(json.dumps(results["margins"]))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
