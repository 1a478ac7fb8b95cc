"""Paired difference of two evaluated policies on the same held-out episodes, over global seeds, from two
multi-seed workdirs (or one): each `<workdir>/seed<k>/results.json` must hold the policy's per-episode `outcomes`
(as every recipe's evaluation, `pipeline.evaluate.evaluate_actors`, writes them).

  python data_tools/paired_runs.py /work/runs/grpo:il /work/runs/grpo:grpo            # B − A within one run
  python data_tools/paired_runs.py /work/runs/grpo:grpo /work/runs/grpo_lag1:grpo     # an ablation against it

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


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("a", help="WORKDIR:POLICY, the reference")
  ap.add_argument("b", help="WORKDIR:POLICY, compared against it")
  ap.add_argument("--resamples", type=int, default=10_000)
  args = ap.parse_args(argv)
  (wa, na), (wb, nb) = (x.rsplit(":", 1) for x in (args.a, args.b))
  a, b = outcomes(wa, na), outcomes(wb, nb)
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
