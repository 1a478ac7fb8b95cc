"""Task suites on disk (one JSON task a line) and the seeded ways a recipe draws episodes from them."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Mapping, Sequence

from jaxagent import types
from jaxagent.pipeline import distributed
from jaxagent.pipeline.stages import write_text


def write_tasks(path: str, tasks: Sequence[types.Task]) -> int:
  """Writes `tasks` (on process 0 alone in a multi-process run, where every process draws the same ones);
  returns their count."""
  if distributed.is_main():
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_text(path, "".join(json.dumps(t.to_json()) + "\n" for t in tasks))
  return len(tasks)


def read_tasks(path: str) -> list[types.Task]:
  """The tasks of a JSONL file; a bad line is a ValueError naming the file, the line and the field."""
  tasks = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
        if not isinstance(record, dict):
          raise ValueError(f"a task is a JSON object, not {type(record).__name__}")
        tasks.append(types.Task.from_json(record))
      except ValueError as e:
        raise ValueError(f"{path}:{number}: {e}") from None
  return tasks


def draw_episodes(tasks: Sequence[types.Task], n: int, seed: int, tag: str) -> list[types.Task]:
  """`n` episodes drawn from `tasks` with a fixed seed: a shuffled pass, repeated when n > len(tasks); ids are
  `<task id>@<tag><k>` so that every episode is unique in its store (and resumable by id)."""
  rng = random.Random(seed)
  out: list[types.Task] = []
  while len(out) < n:
    order = list(tasks)
    rng.shuffle(order)
    out.extend(order[:n - len(out)])
  return [dataclasses.replace(t, id=f"{t.id}@{tag}{k}") for k, t in enumerate(out)]


def disjoint_sets(tasks: Sequence[types.Task], sizes: Mapping[str, int], seed: int) -> dict[str, list[types.Task]]:
  """One set per name (`{"il": 1516, "iter1": 480, ...}`), cut in order from one seeded shuffle, so the sets
  share no task. When `tasks` is smaller than the total, later sets wrap around (reusing tasks) rather than
  coming out empty; a task repeated within one set gets a distinct id (`<id>@<set>.r<n>`, n ≥ 1)."""
  order = list(tasks)
  random.Random(seed).shuffle(order)
  out, pos = {}, 0
  for name, n in sizes.items():
    picked = [order[(pos + k) % len(order)] for k in range(int(n))]
    pos += int(n)
    out[name] = [dataclasses.replace(t, id=f"{t.id}@{name}" + (f".r{k // len(order)}" if k >= len(order) else ""))
                 for k, t in enumerate(picked)]
  return out


def stage_tasks(config, out: str, profile: str) -> dict:
  """A recipe's `tasks` stage: the bundled sites' `profile` suites of `config.tasks.templates` (seed
  `config.tasks.seed`, episodes capped at `config.tasks.max_steps`), one JSON task a line per split, and the
  train split's two parts (`train_a`, `train_b`: `Task.meta["part"]`), which share no intent."""
  from jaxagent.envs import sites  # pylint: disable=g-import-not-at-top  # the sites load only where used
  suites = sites.select(config.tasks.seed, profile, config.tasks.templates, config.tasks.max_steps)
  for part in ("a", "b"):
    suites[f"train_{part}"] = [t for t in suites["train"] if t.meta.get("part") == part]
  return {split: write_tasks(os.path.join(out, f"{split}.jsonl"), tasks) for split, tasks in suites.items()}


def success_rate(trajs: Sequence[types.Trajectory]) -> float:
  """The fraction of the episodes that ran (not `errored`: the browser crashed on every retry) judged a success
  (`success == 1.0`); 0 for none. Errored episodes are neither successes nor failures (`errored_count`)."""
  ran = [t for t in trajs if t.status != "errored"]
  return sum(t.success == 1.0 for t in ran) / len(ran) if ran else 0.0


def errored_count(trajs: Sequence[types.Trajectory]) -> int:
  return sum(t.status == "errored" for t in trajs)


def suite(workdir: str, split: str) -> list[types.Task]:
  """The `tasks` stage's `split` suite of a recipe's workdir."""
  return read_tasks(os.path.join(workdir, "tasks", f"{split}.jsonl"))


def test_episodes(config, workdir: str) -> list[types.Task]:
  """The evaluation's episodes: `eval.episodes` draws from the held-out test split with the fixed `eval.seed`."""
  return draw_episodes(suite(workdir, "test"), int(config.eval.episodes), int(config.eval.seed), "eval")
