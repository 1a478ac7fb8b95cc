"""Two pre-trained bases on the same probes, paired: B − A in grounding, copy, run-ons (a string reply that begins
with the one asked and goes on past it) and exact replies, over every probe and by skill, with a bootstrap
interval over probes (`pipeline.report.paired_difference`, one seed).

Two runs of `configs/pretrain.py` with the same corpus and probe settings (`corpus`, `probes`, `seed`) hold the
same probes (`W/corpus/probes.jsonl`); each run's greedy replies are in `W/probes/replies.json`. Each probe is
scored as the recipe's probes stage scores it (`proj.pretrain.scoring.probe_scores`) and counts once.

  python data_tools/paired_probes.py A B              # A, B: the two pre-training workdirs
  python data_tools/paired_probes.py A B --json out.json
"""

from __future__ import annotations

import argparse
import json
import os

from jaxagent.pipeline import report
from jaxagent.proj.pretrain.scoring import probe_format, probe_group, probe_scores

METRICS = ("grounding", "copy", "run_on", "exact")


def scored(workdir: str) -> dict[str, dict]:
  """probe id → {"skill", "want", and each metric the probe asks: 0.0 or 1.0} of one pre-training workdir."""
  probes_path = os.path.join(workdir, "corpus", "probes.jsonl")
  replies_path = os.path.join(workdir, "probes", "replies.json")
  for path in (probes_path, replies_path):
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} is missing: {workdir} is not a pre-training workdir whose probes stage ran")
  with open(probes_path, encoding="utf-8") as f:
    probes = {p["id"]: p for p in map(json.loads, f)}
  with open(replies_path, encoding="utf-8") as f:
    replies = json.load(f)
  out = {}
  for row in replies:
    probe = probes[row["id"]]
    out[row["id"]] = {"skill": probe_group(probe), "want": row["want"],
                      **probe_scores(probe_format(probe), probe, row["reply"])}
  return out


def paired(a: dict[str, dict], b: dict[str, dict], resamples: int = 10_000) -> dict[str, dict]:
  """{"all" | skill: {metric: paired_difference (B − A) with "a", "b" and "n"}} over the probes both hold."""
  if set(a) != set(b) or any(a[k]["want"] != b[k]["want"] for k in a):
    raise ValueError("the two workdirs hold different probes; pair runs with the same corpus, probes and seed "
                     "settings (only what the base learns may differ)")
  out: dict[str, dict] = {}
  for group in ["all"] + sorted({p["skill"] for p in a.values()}):
    for metric in METRICS:
      ids = [k for k in sorted(a) if metric in a[k] and (group == "all" or a[k]["skill"] == group)]
      if not ids:
        continue
      xa, xb = [a[k][metric] for k in ids], [b[k][metric] for k in ids]
      out.setdefault(group, {})[metric] = {**report.paired_difference({0: (xa, xb)}, resamples),
                                           "a": sum(xa) / len(xa), "b": sum(xb) / len(xb), "n": len(ids)}
  return out


def table(result: dict[str, dict]) -> str:
  rows = ["| probes | metric | n | A | B | B − A [95 %] |", "|---|---|---|---|---|---|"]
  for group, metrics in result.items():
    for metric, r in metrics.items():
      lo, hi = r["ci95"]
      rows.append(f"| {group} | {metric} | {r['n']} | {100 * r['a']:.1f} % | {100 * r['b']:.1f} % | "
                  f"{100 * r['mean']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] |")
  return "\n".join(rows)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("a", help="the first pre-training workdir (A)")
  parser.add_argument("b", help="the second (B): the table reports B − A")
  parser.add_argument("--resamples", type=int, default=10_000)
  parser.add_argument("--json", default="", help="also write the figures to this file")
  args = parser.parse_args(argv)
  result = paired(scored(args.a), scored(args.b), args.resamples)
  print(table(result))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == "__main__":
  main()
