"""Trains a finished WebRL run's ORM again on the run's own stored episodes, with other config values and
optionally hindsight relabelling, and prints its agreement with the judge on the run's held-out ORM episodes.

  python data_tools/webrl_orm_retrain.py --workdir W --out /tmp/orm_x orm.near_misses=96
  python data_tools/webrl_orm_retrain.py --workdir W --out /tmp/orm_y --relabel 1 orm.train.steps=450
  python data_tools/webrl_orm_retrain.py --workdir W --out /tmp/orm_z --from-checkpoint orm.held_out=task \
      model.hf_checkpoint=smollm2 data.tokenizer= data.seq_len=4096 orm.warmup.steps=0 orm.optim.lr=5e-5 ...

`W` is one seed's workdir (its `config.json`, `tasks`, `sft`, `orm`); π_0's rollouts and the near misses are copied
from `W/orm` and only the ones a larger `orm.episodes` / `orm.near_misses` asks for are run (Chromium, the sites).
The held-out split is the stage's (a run from before `orm.held_out` split by episode; `orm.held_out=task` splits
it by intent). `--relabel N` adds, for every train episode, the sibling train tasks (same template, other intent)
whose evaluator its stored final state passes, as positives, and N siblings whose evaluator it fails, as negatives
(hindsight relabelling, Andrychowicz et al., 2017): the same history under intents it does and does not satisfy.
Only evaluators the judge can read from a stored episode count (URL and answer matches; a `state_match` needs the
live session and is skipped). `fresh_episodes`: how many held-out episodes have an ORM text that no train sample
has (relabelling can put a held-out near miss's text in train).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import time
from typing import Sequence

import ml_collections

from jaxagent import types
from jaxagent.judges.evaluators import ProgrammaticJudge
from jaxagent.pipeline import device
from jaxagent.proj.webrl import orm
from jaxagent.recipes import webrl


def _offline(url: str) -> dict:
  raise OSError(f"{url}: a stored episode has no live session to read")


def relabel(trajs: Sequence[types.Trajectory], pool: Sequence[types.Task], negatives: int,
            seed: int) -> list[tuple[types.Trajectory, bool]]:
  """(episode under a sibling task, the judge's verdict) pairs: every sibling it passes, `negatives` it fails."""
  judge = ProgrammaticJudge(fetch_state=_offline)
  rng = random.Random(seed)
  out = []
  for t in trajs:
    passed, failed = [], []
    for s in pool:
      if s.template != t.task.template or s.intent == t.task.intent:
        continue
      verdict = judge.evaluate(s, dataclasses.replace(t, task=s)).success
      if verdict is not None:
        (passed if verdict == 1.0 else failed).append(s)
    chosen = [(s, True) for s in passed] + [(s, False) for s in rng.sample(failed, min(negatives, len(failed)))]
    out.extend((dataclasses.replace(t, task=s, success=1.0 if ok else 0.0), ok) for s, ok in chosen)
  return out


def override(config: ml_collections.ConfigDict, assignment: str) -> None:
  """`a.b.c=value`, cast to the type the key has; an unknown key is refused, naming it."""
  key, _, value = assignment.partition("=")
  *parents, leaf = key.split(".")
  node = config
  for part in parents:
    node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
  if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
    raise KeyError(f"{key!r}: the run's config has no such key")
  old = node[leaf]
  node[leaf] = (value.lower() in ("1", "true")) if isinstance(old, bool) else type(old)(value)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--relabel", type=int, default=0, help="relabelled negatives per train episode (0 = off)")
  parser.add_argument("--from-checkpoint", action="store_true",
                      help="start from model.hf_checkpoint's weights (set it among the overrides), not the run's π_0")
  parser.add_argument("overrides", nargs="*", help="config key=value")
  args = parser.parse_args(argv)
  with open(os.path.join(args.workdir, "config.json"), encoding="utf-8") as f:
    config = ml_collections.ConfigDict(json.load(f))
  if "held_out" not in config.orm:
    config.orm.held_out = "episode"  # a run from before the key split by episode
  if "page" not in config.orm:
    config.orm.page = "prompt"  # a run from before the key read the page as the prompt cut it
  for assignment in args.overrides:
    override(config, assignment)
  config.train.progress_bar = False
  shutil.rmtree(args.out, ignore_errors=True)
  for name in ("store", "near_misses"):
    shutil.copytree(os.path.join(args.workdir, "orm", name), os.path.join(args.out, name))
  start = time.monotonic()
  _, _, train, val = webrl.orm_episodes(config, args.workdir, args.out)
  samples = [(t, t.success == 1.0) for t in train]
  if args.relabel:
    samples += relabel(train, device.suite(args.workdir, "train"), args.relabel, int(config.seed))
  options = orm.text_options(config)
  items = [orm.orm_sample(t, ok, f"orm-{i}", **options) for i, (t, ok) in enumerate(samples)]
  held_out = orm.train(config, args.workdir, args.out, items, val, from_policy=not args.from_checkpoint)
  texts = {it["conversations"][0]["value"] for it in items}
  fresh = [t for t in val if orm.orm_text(t, **options) not in texts]
  result = {"train_samples": len(items), "train_positive": sum(ok for _, ok in samples), "held_out": held_out,
            "fresh_episodes": len(fresh), "seconds": round(time.monotonic() - start)}
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
