"""What WebRL's offline curriculum generators draw on the sites benchmark, side by side, without a model.

  python data_tools/curriculum_draws.py --profile text --failed 48 --seed 101

Stands in `--failed` tasks drawn at random from `train_b` for a phase's failures and draws as many tasks from
`train_c` with `variations` and with `mutations` (`proj/webrl/curriculum.py`). Per generator: the tiers and
families drawn and the distinct intents; for mutations, each kind's count and how far it moved the tier.
"""

from __future__ import annotations

import argparse
import collections
import json
import random

from jaxagent.envs.sites import bench
from jaxagent.proj.webrl import curriculum


def draws(profile: str = "text", failed: int = 48, seed: int = 101, world: int = 0, level: int = 2) -> dict:
  suite = bench.generate(world, profile, level, splits=("train_b", "train_c"))
  seeds = random.Random(seed).sample(suite["train_b"], failed)
  varied = curriculum.variations(seeds, suite["train_c"], failed, seed, "p1.")
  mutated, kinds = curriculum.mutations(seeds, suite["train_c"], failed, seed, "p1.")
  count = lambda key, tasks: dict(sorted(collections.Counter(t.meta[key] for t in tasks).items()))
  source = {t.meta["intent_id"]: t for t in seeds}
  moves = collections.Counter(
      f"{m.meta['mutation']['kind']} {m.meta['tier'] - source[m.meta['mutation']['from']].meta['tier']:+d}"
      for m in mutated if "mutation" in m.meta)
  row = lambda tasks: {"tiers": count("tier", tasks), "families": count("family", tasks),
                       "distinct_intents": len({t.intent for t in tasks})}
  return {"failed": row(seeds), "variations": row(varied),
          "mutations": {**row(mutated), "kinds": kinds, "kind_tier_change": dict(sorted(moves.items()))}}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--profile", default="text", choices=bench.PROFILES)
  p.add_argument("--failed", type=int, default=48)
  p.add_argument("--seed", type=int, default=101)
  p.add_argument("--world", type=int, default=0, help="the benchmark world's seed (a run's tasks.seed)")
  args = p.parse_args()
  print(json.dumps(draws(args.profile, args.failed, args.seed, args.world), indent=1))


if __name__ == "__main__":
  main()
