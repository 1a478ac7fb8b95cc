"""Paired difference of two evaluated policies on the same held-out episodes, over global seeds, from two
multi-seed workdirs (or one): each `<workdir>/seed<k>/results.json` must hold the policy's per-episode `outcomes`
(as every recipe's evaluation, `pipeline.evaluate.evaluate_actors`, writes them).

  python data_tools/paired_runs.py /work/runs/grpo:il /work/runs/grpo:grpo            # B − A within one run
  python data_tools/paired_runs.py /work/runs/grpo:grpo /work/runs/grpo_lag1:grpo     # an ablation against it
  python data_tools/paired_runs.py A_seed1.json,A_seed2.json B_seed1.json,B_seed2.json # kept records, a seed each

A kept record (`docs/results/data/*.headline.json`) holds one evaluation's `outcomes` (episode id → 0/1, or one
seed's key → that); the comma-separated records of each side pair by position.

Prints per seed both success rates and B − A, then the mean difference with its hierarchical (seeds × episodes)
bootstrap 95 % interval and the probability of improvement (`pipeline.report.paired_difference`).
"""

from __future__ import annotations

import argparse
import json
import os

from jaxagent.pipeline.report import paired_difference
from jaxagent.pipeline.seeds import seed_workdirs


def outcomes(workdir: str, name: str) -> dict[int, dict[str, float]]:
  """seed → episode id → 0/1 of policy `name` in each `seed<k>/results.json` of `workdir`."""
  out = {}
  for seed, root in seed_workdirs(workdir).items():
    path = os.path.join(root, "results.json")
    if not os.path.exists(path):
      continue
    with open(path, encoding="utf-8") as f:
      results = json.load(f)
    if name not in results or "outcomes" not in results[name]:
      raise ValueError(f"{path}: no per-episode outcomes for policy {name!r} (has {sorted(results)})")
    out[seed] = results[name]["outcomes"]
  if not out:
    raise FileNotFoundError(f"{workdir}: no seed*/results.json")
  return out


def records(paths: str) -> dict[int, dict[str, float]]:
  """position → episode id → 0/1 from comma-separated kept records (a seed each, in the same order on both sides)."""
  out = {}
  for k, path in enumerate(paths.split(",")):
    with open(path, encoding="utf-8") as f:
      got = json.load(f)["outcomes"]
    if got and all(isinstance(v, dict) for v in got.values()):
      (got,) = got.values()
    out[k] = {episode: float(v) for episode, v in got.items()}
  return out


def _side(spec: str) -> tuple[dict[int, dict[str, float]], str]:
  if spec.endswith(".json") or ".json," in spec:
    return records(spec), os.path.basename(spec.split(",")[0]).removesuffix(".json")
  workdir, name = spec.rsplit(":", 1)
  return outcomes(workdir, name), name


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("a", help="WORKDIR:POLICY (or kept records R1.json,R2.json), the reference")
  ap.add_argument("b", help="WORKDIR:POLICY (or kept records), compared against it")
  ap.add_argument("--resamples", type=int, default=10_000)
  args = ap.parse_args(argv)
  (a, na), (b, nb) = _side(args.a), _side(args.b)
  seeds = sorted(set(a) & set(b))
  pairs = {}
  for s in seeds:
    ids = sorted(set(a[s]) & set(b[s]))
    if len(ids) != len(a[s]) or len(ids) != len(b[s]):
      raise ValueError(f"seed {s}: the two runs played different episodes ({len(a[s])} vs {len(b[s])}, "
                       f"{len(ids)} shared)")
    pairs[s] = ([a[s][i] for i in ids], [b[s][i] for i in ids])
    ra, rb = (sum(x) / len(x) for x in pairs[s])
    print(f"seed {s}: {na} {ra:.1%}  {nb} {rb:.1%}  difference {rb - ra:+.1%} over {len(ids)} episodes")
  d = paired_difference(pairs, args.resamples)
  print(f"{nb} − {na}: {d['mean']:+.1%} [{d['ci95'][0]:+.1%}, {d['ci95'][1]:+.1%}] (95 % hierarchical bootstrap, "
        f"{len(seeds)} seeds), P(improvement) {d['p_improve']:.2f}")
  return d


if __name__ == "__main__":
  main()
