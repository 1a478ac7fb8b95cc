"""The benchmark's tabular separation check and its baseline table, on the sites' link graph (no browser).

  python data_tools/bench_check.py --level 2 --episodes 1600 --json check.json
  python data_tools/bench_check.py --level 2 --episodes 1000 --control-episodes 10 --seeds 0,1,2  # three worlds

1. Behaviour data: the goal-aware noisy policy (`linkgraph.NoisyLinkPolicy`) on `train_b` intents of every family,
   each intent once with its own episode seed (the negative control's 8 `train_b` pairs repeated to a share
   like the others').
2. Tabular IL, Filtered BC, greedy Q and Best-of-N (`jaxagent.rl.tabular`) from those episodes.
3. Every policy, the scripted expert, the noisy policy and a uniform random policy on the headline's intents
   (test_comb ∪ test_value ∪ test_template), each intent once, the same episode (seed) for every policy; and on
   the negative control's 8 test pairs, each with `--control-episodes` episode seeds.

The margins the benchmark promises (fixed before any neural run, docs/benchmark.md): on the headline at level 2
Q − FBC ≥ 10 points and FBC − IL ≥ 10; on the negative control |Q − FBC| ≤ 3.

With `--seeds`, one check per global seed (the world, its intents and the behaviour data all follow it) and the
margins paired intent by intent: each world's with its bootstrap interval over intents, and the worlds together
with the hierarchical (worlds × intents) one, as the recipes' figures are read (`pipeline.report`).
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
from jaxagent.pipeline import report
from jaxagent.rl import tabular
from jaxagent.types import Task

POLICIES = ("expert", "noisy", "random", "il", "fbc", "q", "bon")
MARGINS = (("q_minus_fbc", "headline", "fbc", "q"), ("fbc_minus_il", "headline", "il", "fbc"),
           ("control_q_minus_fbc", "control", "fbc", "q"))  # (name, episodes, A, B): B − A


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
      "headline": {}, "control": {}, "tier": {}, "outcomes": {}}
  for name, policy in policies.items():
    rows = play(env, policy, headline, seed)
    control_rows = play(env, policy, control, seed)
    results["headline"][name] = summarise(rows)
    results["tier"][name] = summarise(rows, "tier")
    results["control"][name] = summarise(control_rows)["all"]
    results["outcomes"][name] = {"headline": [r["success"] for r in rows],
                                 "control": [r["success"] for r in control_rows]}
    log(f"{name:7s} headline {results['headline'][name]['all']['success']:5.1f} %  "
        f"control {results['control'][name]['success']:5.1f} %  ({time.time() - t0:.0f} s)")
  h, c = results["headline"], results["control"]
  results["margins"] = {"q_minus_fbc": h["q"]["all"]["success"] - h["fbc"]["all"]["success"],
                        "fbc_minus_il": h["fbc"]["all"]["success"] - h["il"]["all"]["success"],
                        "control_q_minus_fbc": c["q"]["success"] - c["fbc"]["success"]}
  results["seconds"] = time.time() - t0
  return results


def paired_margins(per_seed: dict[int, dict[str, Any]], resamples: int = 10_000) -> dict[str, dict[str, Any]]:
  """Each margin (`MARGINS`) in points, intent by intent on the same episodes: per world (`per_seed[s]` a `check`
  result) with the bootstrap over its intents, and over all worlds with the hierarchical one."""
  out: dict[str, dict[str, Any]] = {}
  for name, episodes, a, b in MARGINS:
    pairs = {s: (r["outcomes"][a][episodes], r["outcomes"][b][episodes]) for s, r in per_seed.items()}
    row = {str(s): report.paired_difference({s: pair}, resamples) for s, pair in pairs.items()}
    if len(pairs) > 1:
      row["all"] = report.paired_difference(pairs, resamples)
    out[name] = {k: {"mean": 100 * v["mean"], "ci95": [100 * x for x in v["ci95"]], "episodes": sum(v["episodes"])}
                 for k, v in row.items()}
  return out


def margins_markdown(margins: dict[str, dict[str, Any]]) -> str:
  """The paired margins as a table: a row per world (and `all`), a column per margin."""
  worlds = list(next(iter(margins.values())))
  lines = ["| world | " + " | ".join(name for name, *_ in MARGINS) + " |", "|---" * (len(MARGINS) + 1) + "|"]
  for w in worlds:
    cells = [f"{margins[name][w]['mean']:+.1f} [{margins[name][w]['ci95'][0]:+.1f}, {margins[name][w]['ci95'][1]:+.1f}]"
             for name, *_ in MARGINS]
    lines.append(f"| {w} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


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
  p.add_argument("--seeds", default="0", help="global seeds (worlds), comma-separated: one check each, and the "
                 "margins paired over them")
  p.add_argument("--random", type=int, default=0, help="also the random policy's floor per tier on this many "
                 "train_c intents of the device profile")
  p.add_argument("--json", default="", help="write the results here")
  args = p.parse_args(argv)
  try:
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
  except ValueError:
    p.error(f"--seeds={args.seeds!r}: give global seeds as integers, comma-separated (e.g. 0,1,2)")
  if not seeds or len(set(seeds)) != len(seeds):
    p.error(f"--seeds={args.seeds!r}: give one or more distinct global seeds (e.g. 0,1,2)")
  per_seed = {}
  for seed in seeds:
    results = check(args.level, args.episodes, args.control_episodes, seed)
    if args.random:
      results["random_floor"] = floors(args.level, args.random, seed)
      print("random floor (device, train_c):", {k: f"{v['success']:.2f} % of {v['n']}"
                                                for k, v in results["random_floor"].items()})
    print(f"world {seed}:\n{markdown(results)}")
    per_seed[seed] = results
  margins = paired_margins(per_seed)
  print(margins_markdown(margins))
  if args.json:
    out = per_seed[seeds[0]] if len(seeds) == 1 else {"worlds": {str(s): r for s, r in per_seed.items()}}
    with open(args.json, "w") as f:
      json.dump({**out, "paired_margins": margins}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
