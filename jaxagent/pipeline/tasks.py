"""Task suites on disk (one JSON task a line) and the seeded ways a recipe draws episodes from them."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Mapping, Sequence

from jaxagent import types
from jaxagent.pipeline import distributed
from jaxagent.pipeline.config import ConfigError, names
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


# The train splits a stage may draw from (`bench_tasks` writes all four; the sites' suites the first three).
TRAIN_SPLITS = ("train", "train_a", "train_b", "train_c")


def stage_tasks(config, out: str, profile: str) -> dict:
  """A recipe's `tasks` stage, one JSON task a line per split. `config.tasks.suite="sites"`: the bundled sites'
  `profile` suites of `config.tasks.templates` (seed `config.tasks.seed`, episodes capped at
  `config.tasks.max_steps`), and the train split's two parts (`train_a`, `train_b`: `Task.meta["part"]`), which
  share no intent. `"bench"`: the sites benchmark (`bench_tasks`)."""
  if str(config.tasks.get("suite", "sites")) == "bench":
    return bench_tasks(config, out, profile)
  from jaxagent.envs import sites  # pylint: disable=g-import-not-at-top  # the sites load only where used
  suites = sites.select(config.tasks.seed, profile, config.tasks.templates, config.tasks.max_steps)
  for part in ("a", "b"):
    suites[f"train_{part}"] = [t for t in suites["train"] if t.meta.get("part") == part]
  return {split: write_tasks(os.path.join(out, f"{split}.jsonl"), tasks) for split, tasks in suites.items()}


def bench_tasks(config, out: str, profile: str) -> dict:
  """`bench_splits` written to `out`, one JSON task a line per split; returns each split's count."""
  splits = bench_splits(config, profile)
  return {split: write_tasks(os.path.join(out, f"{split}.jsonl"), tasks) for split, tasks in splits.items()}


def bench_splits(config, profile: str) -> dict[str, list[types.Task]]:
  """The sites benchmark's splits (`envs/sites/bench.py`, `docs/benchmark.md`) for `profile` at perturbation level
  `config.tasks.level`, families `config.tasks.templates` ("" = all), world `config.tasks.seed`; each family's
  own step cap. `train_a` (demonstrations), `train_b` (offline, behaviour and ORM data), `train_c` (online rounds,
  curriculum, exploration), `train` (the three), `test` (the headline: every held-out intent once, the negative
  control left out) and `control` (the negative control's held-out intents)."""
  from jaxagent.envs.sites import bench  # pylint: disable=g-import-not-at-top
  families = names(config.tasks.templates) or list(bench.FAMILIES)
  made = bench.generate(int(config.tasks.seed), profile, int(config.tasks.level), families,
                        bench.TRAIN_SPLITS + bench.HEADLINE)
  splits = {s: made[s] for s in bench.TRAIN_SPLITS}
  splits["train"] = [t for s in bench.TRAIN_SPLITS for t in made[s]]
  splits["test"] = bench.headline(made)
  splits["control"] = bench.control(made)
  return splits


def check_split_keys(config, keys: Sequence[str]) -> None:
  """Each of `keys` (e.g. "online.split"; a value may list several, comma-separated) names train splits the run's
  suite writes: `train_c` is the benchmark's alone. A ConfigError naming the key otherwise."""
  if config.tasks.get("suite", "sites") == "bench":
    return
  for key in keys:
    block, name = key.rsplit(".", 1)
    value = config[block][name]
    listed = names(value)
    if "train_c" in listed:
      fix = ",".join(n for n in listed if n != "train_c") or "train"
      raise ConfigError(f"config.{key}={value!r} names train_c, a part of the benchmark only "
                        f"(tasks.suite=bench); the sites' suites have train, train_a and train_b: set "
                        f"--config.{key}={fix}")


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
  """The evaluation's episodes: `eval.episodes` drawn from the held-out test split with the fixed `eval.seed`;
  0 = every test task once (the benchmark's protocol: each held-out intent once per policy)."""
  tasks = suite(workdir, "test")
  return draw_episodes(tasks, int(config.eval.episodes) or len(tasks), int(config.eval.seed), "eval")


def control_episodes(config, workdir: str) -> list[types.Task]:
  """The benchmark's negative control (`tasks.suite=bench`), every held-out intent once; none otherwise."""
  if config.tasks.get("suite", "sites") != "bench":
    return []
  tasks = suite(workdir, "control")
  return draw_episodes(tasks, len(tasks), int(config.eval.seed), "control")
