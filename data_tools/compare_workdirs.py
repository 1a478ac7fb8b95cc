"""Where two runs of a recipe part ways: every trajectory store and training log two workdirs share, compared.

  python data_tools/compare_workdirs.py /tmp/jaxagent/digiq_a /tmp/jaxagent/digiq_b

Two runs of the same commit and config should agree bit for bit. Per store (a directory holding `episodes.jsonl`,
found under both workdirs): episodes, how many differ in their actions, and how many screens differ in pixels; per
training (`metrics.jsonl`): whether the losses match. The first store that differs, in stage order, is where to
look (e.g. screens that differ after the same actions: the environment, not the model).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import rollout


def _relative(workdir: str, name: str) -> list[str]:
  found = []
  for root, dirs, files in os.walk(workdir):
    dirs.sort()
    if name in files:
      found.append(os.path.relpath(root, workdir))
  return found


def compare_store(a: str, b: str) -> dict:
  """Episodes (by position), those whose action texts differ, and screens (steps with a screenshot in both) whose
  pixels differ."""
  sa, sb = TrajectoryStore(a), TrajectoryStore(b)
  ea, eb = rollout.episodes(sa), rollout.episodes(sb)
  actions = sum([s.action_text for s in x.steps] != [s.action_text for s in y.steps] for x, y in zip(ea, eb))
  screens = differing = 0
  for x, y in zip(ea, eb):
    for s, t in zip(x.steps, y.steps):
      if s.image_path and t.image_path:
        screens += 1
        differing += not np.array_equal(sa.load_image(s.image_path), sb.load_image(t.image_path))
  return {"episodes": [len(ea), len(eb)], "actions_differ": int(actions), "screens": screens,
          "screens_differ": int(differing)}


def losses(path: str) -> list[tuple[int, float]]:
  with open(path, encoding="utf-8") as f:
    return [(row["step"], row["loss"]) for row in map(json.loads, f) if "loss" in row]


def compare(a: str, b: str) -> dict:
  """{"stores": {relative dir: compare_store}, "trainings": {relative dir: True if the losses match}} over what
  both workdirs hold, in directory order."""
  stores = [d for d in _relative(a, "episodes.jsonl") if os.path.isfile(os.path.join(b, d, "episodes.jsonl"))]
  trainings = [d for d in _relative(a, "metrics.jsonl") if os.path.isfile(os.path.join(b, d, "metrics.jsonl"))]
  return {"stores": {d: compare_store(os.path.join(a, d), os.path.join(b, d)) for d in stores},
          "trainings": {d: losses(os.path.join(a, d, "metrics.jsonl")) == losses(os.path.join(b, d, "metrics.jsonl"))
                        for d in trainings}}


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("a", help="a workdir")
  ap.add_argument("b", help="another run's workdir")
  args = ap.parse_args(argv)
  out = compare(args.a, args.b)
  for d, r in out["stores"].items():
    same = r["episodes"][0] == r["episodes"][1] and not r["actions_differ"] and not r["screens_differ"]
    print(f"{'same' if same else 'DIFFERS':8s} {d}: {r['episodes'][0]}/{r['episodes'][1]} episodes, actions differ in "
          f"{r['actions_differ']}, screens differ {r['screens_differ']}/{r['screens']}")
  for d, same in out["trainings"].items():
    print(f"{'same' if same else 'DIFFERS':8s} {d}: losses")
  if not out["stores"] and not out["trainings"]:
    print(f"nothing to compare: no store or training log both {args.a} and {args.b} hold")
  return out


if __name__ == "__main__":
  main()
