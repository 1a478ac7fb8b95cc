"""The protocol's headline: a whole recipe repeated over global seeds (`python -m jaxagent.main ... --seeds=0,1,2`).

Each seed runs the full pipeline in `<workdir>/seed<k>/` with `config.seed = k` (the task suites stay those of
`config.tasks.seed`: the benchmark is fixed, the demonstrations, initialisations, samples and data are not), so a
killed multi-seed run resumes where it stopped. `<workdir>/results.json` then holds the per-seed results combined:
every success rate becomes the mean over seeds with its spread (`report.over_seeds`), other numbers their mean,
and values that agree across seeds (episode counts, temperatures) stay as they are.
"""

from __future__ import annotations

import copy
import os
import re
import statistics
from typing import Any, Callable, Sequence

from jaxagent.pipeline import distributed, report
from jaxagent.pipeline.provenance import with_provenance
from jaxagent.pipeline.stages import write_json


# What a policy's (or a stage's) result calls its success rate: the device recipes' and OpenWebVoyager's.
RATE_KEYS = ("success_rate", "test_success_rate")


def parse_seeds(text: str) -> list[int]:
  """"0,1,2" → [0, 1, 2]; refuses repeats and non-integers, naming the flag."""
  try:
    seeds = [int(s) for s in str(text).split(",") if s.strip()]
  except ValueError:
    raise ValueError(f"--seeds={text!r}: expected comma-separated integers, e.g. --seeds=0,1,2") from None
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f"--seeds={text!r}: expected distinct comma-separated integers, e.g. --seeds=0,1,2")
  return seeds


def seed_workdir(workdir: str, seed: int) -> str:
  return os.path.join(workdir, f"seed{seed}")


def seed_workdirs(workdir: str) -> dict[int, str]:
  """seed → `seed<k>` directory of a multi-seed `workdir` (`--seeds`), by seed; {} for a single-seed one."""
  found = {}
  for name in os.listdir(workdir) if os.path.isdir(workdir) else ():
    m = re.fullmatch(r"seed(\d+)", name)
    if m and os.path.isdir(os.path.join(workdir, name)):
      found[int(m.group(1))] = os.path.join(workdir, name)
  return dict(sorted(found.items()))


def combine(per_seed: dict[int, Any]) -> Any:
  """Per-seed results (same structure) → one: success rates as `report.over_seeds` with the per-seed values,
  other numbers their mean, anything equal across seeds as it is, anything else the per-seed list."""
  values = list(per_seed.values())
  first = values[0]
  if all(isinstance(v, dict) for v in values) and all(v.keys() == first.keys() for v in values):
    out = {k: combine({s: v[k] for s, v in per_seed.items()}) for k in first}
    key = next((k for k in RATE_KEYS if isinstance(first.get(k), (int, float))), None)
    if key:
      rates = {s: {"success_rate": float(v[key])} for s, v in per_seed.items()}
      spread = report.over_seeds(rates)
      out.update({key: spread["mean"]}, std=spread["std"], min=spread["min"], max=spread["max"],
                 per_seed={str(s): r["success_rate"] for s, r in rates.items()})
    return out
  if all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
    return [combine({s: v[i] for s, v in per_seed.items()}) for i in range(len(first))]
  if all(v == first for v in values):
    return first
  if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
    return statistics.fmean(float(v) for v in values)
  return [per_seed[s] for s in per_seed]


def table(combined: dict) -> str:
  """One row per policy (or per stage of a list such as OpenWebVoyager's `per_iteration`): the mean success rate
  over seeds ± its sample standard deviation, range, per seed."""
  rows = ["policy             mean ± std         range          per seed"]
  named = [(n, r) for n, r in combined.items() if isinstance(r, dict)]
  named += [(r.get("stage", f"{n}[{i}]"), r) for n, rs in combined.items() if isinstance(rs, list)
            for i, r in enumerate(rs) if isinstance(r, dict)]
  for name, r in named:
    if "per_seed" in r:
      mean = next(r[k] for k in RATE_KEYS if k in r)
      per = "  ".join(f"{s}: {v:.1%}" for s, v in r["per_seed"].items())
      rows.append(f"{name:<18} {mean:6.1%} ± {r['std']:5.1%}   {r['min']:5.1%}–{r['max']:5.1%}   {per}")
  return "\n".join(rows)


def run_seeds(run: Callable[[Any, str], Any], config, workdir: str, seeds: Sequence[int],
              write_config: Callable[[Any, str], None], pairs: Sequence[tuple[str, str]] = ()) -> dict:
  """`run(config_k, workdir_k)` for every seed k (after `write_config(config_k, workdir_k)`, which makes the
  directory), then their results combined into `<workdir>/results.json` (listed per seed when `run` returns no
  results dict); `pairs` (a recipe's `PAIRS`) adds paired differences beyond those against the first policy."""
  per_seed = {}
  for seed in seeds:
    cfg = copy.deepcopy(config)
    cfg.seed = int(seed)
    out = seed_workdir(workdir, seed)
    write_config(cfg, out)
    print(f"\n=== seed {seed} → {out}")
    per_seed[int(seed)] = run(cfg, out)
  if not all(isinstance(r, dict) for r in per_seed.values()):
    return _listed(per_seed, workdir)
  combined = {"seeds": list(map(int, seeds)), **combine(_without_outcomes(per_seed))}
  hierarchical_stats = hierarchical(per_seed)
  for name, stats in hierarchical_stats.items():
    combined[name]["hierarchical"] = stats
  combined.update(paired_differences(per_seed, pairs))
  combined.update(stratified(per_seed, pairs))
  if distributed.is_main():  # every process combined the same results
    write_json(os.path.join(workdir, "results.json"), with_provenance(combined))
  print(f"\nover seeds {list(seeds)}:\n{table(combined)}")
  for name, d in hierarchical_stats.items():
    print(f"{name}: {d['mean']:.1%} [{d['ci95'][0]:.1%}, {d['ci95'][1]:.1%}] over seeds x episodes "
          f"({sum(d['episodes'])} episodes)")
  for name, d in combined.get("paired", {}).items():
    print(f"{name}: {d['mean']:+.1%} [{d['ci95'][0]:+.1%}, {d['ci95'][1]:+.1%}] paired over "
          f"{sum(d['episodes'])} episodes, P(improvement) {d['p_improve']:.2f}")
  return combined


def _without_outcomes(per_seed: dict[int, Any]) -> dict[int, Any]:
  return {s: {k: ({kk: vv for kk, vv in v.items() if kk not in ("outcomes", "strata")} if isinstance(v, dict) else v)
              for k, v in r.items()} for s, r in per_seed.items()}


def _with_outcomes(per_seed: dict[int, Any]) -> list[str]:
  """The policies whose per-episode `outcomes` every seed's results give (in the first seed's order)."""
  results = list(per_seed.values())
  return [n for n, r in results[0].items() if isinstance(r, dict) and "outcomes" in r
          and all(isinstance(x.get(n), dict) and x[n].get("outcomes") for x in results)]


def hierarchical(per_seed: dict[int, Any]) -> dict:
  """Each policy with per-episode outcomes: its mean over seeds with the hierarchical (seeds × episodes)
  bootstrap 95 % interval (`report.hierarchical_mean`)."""
  return {n: report.hierarchical_mean({s: list(r[n]["outcomes"].values()) for s, r in per_seed.items()})
          for n in _with_outcomes(per_seed)}


def paired_differences(per_seed: dict[int, Any], pairs: Sequence[tuple[str, str]] = ()) -> dict:
  """Where every seed's results give each policy's per-episode `outcomes` (episode id → 0/1 on the same
  episodes), each policy after the first minus the first (the start it was trained from), then each
  `(policy, baseline)` of `pairs` (the comparisons a recipe's paper makes, e.g. Digi-Q − Filtered BC) whose two
  policies have outcomes, paired per episode (`report.paired_difference`: the mean, a hierarchical bootstrap 95 %
  interval, the probability of improvement)."""
  names = _with_outcomes(per_seed)
  if len(names) < 2:
    return {}
  out = {}
  for name, base in report.comparisons(names, pairs):
    paired = {}
    for s, r in per_seed.items():
      ids = sorted(set(r[base]["outcomes"]) & set(r[name]["outcomes"]))
      paired[s] = ([r[base]["outcomes"][i] for i in ids], [r[name]["outcomes"][i] for i in ids])
    out[f"{name} - {base}"] = report.paired_difference(paired)
  return {"paired": out}


def stratified(per_seed: dict[int, Any], pairs: Sequence[tuple[str, str]] = ()) -> dict:
  """Per family, tier and split (`report.by_stratum`), where every seed's results give each policy's outcomes
  with their strata: each policy's mean and interval, each later policy minus the first and `pairs`, paired."""
  names = _with_outcomes(per_seed)
  if not names or not all(all(r[n].get("strata") for n in names) for r in per_seed.values()):
    return {}
  return {"by_stratum": report.by_stratum(per_seed, names, pairs=pairs)}


def _listed(per_seed: dict[int, Any], workdir: str) -> dict:
  """A recipe that returns no results dict (il: its final checkpoint) has nothing to average over seeds:
  `results.json` lists what each seed returned, and the message says how to evaluate them."""
  listed = {"seeds": list(per_seed), "per_seed": {str(s): r for s, r in per_seed.items()}}
  if distributed.is_main():
    write_json(os.path.join(workdir, "results.json"), with_provenance(listed))
  rows = "\n".join(f"  seed {s}: {r}" for s, r in per_seed.items())
  print(f"\nover seeds {list(per_seed)}: the recipe returned no evaluation results to combine; evaluate each "
        f"seed's policy with `python -m jaxagent.evaluate --policy <checkpoint> --suite ...`. Per seed:\n{rows}")
  return listed
