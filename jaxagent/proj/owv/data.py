"""OpenWebVoyager's data: query sets, the observation the policy sees, trajectories → samples, data mixing.

`reference/algorithms.md` §2.2–2.4. The conversation format is `agents.openwebvoyager`'s (turn 1 = task +
screenshot + accessibility tree, older turns collapsed, ≤3 screenshots per sample); this module shortens
the observation for a small context, builds the acting prompt, turns judged trajectories into per-step samples
on disk, and mixes the sources of an optimisation iteration (`mix`).
"""

from __future__ import annotations

import json
import os
import random
import re
from typing import Mapping, Sequence

import numpy as np
from PIL import Image

from jaxagent import types
from jaxagent.agents import openwebvoyager
from jaxagent.data import conversation
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import distributed, rollout
from jaxagent.pipeline.stages import write_json, write_text

# ------------------------------------------------------------------------------------ observation

compact_tree = openwebvoyager.compact_tree
CompactOpenWebVoyager = openwebvoyager.CompactOpenWebVoyager


def make_format(config) -> CompactOpenWebVoyager:
  o = config.observation
  return CompactOpenWebVoyager(int(o.max_tree_lines), bool(o.drop_urls), int(o.history_images))


# ---------------------------------------------------------------------------------------- samples


def trajectory_samples(traj: types.Trajectory, store: TrajectoryStore, image_dir: str,
                       n_steps: int = openwebvoyager.LAST_N) -> list[dict]:
  """Per-step OWV samples of one trajectory (§2.3: every step is a sample carrying its compressed history),
  from the user turns the policy was shown (`Step.obs_text`) and its replies; screenshots are copied to
  `image_dir/<flag>--stepNN.png` and named relative to the data file one level up (`images/...`)."""
  flag = re.sub(r"[^A-Za-z0-9_.@-]", "_", traj.meta.get("episode_id") or traj.task.id)
  os.makedirs(image_dir, exist_ok=True)
  for t, s in enumerate(traj.steps, start=1):
    if not s.image_path:
      raise ValueError(f"trajectory {traj.task.id!r} step {t - 1} has no screenshot in the store")
    dst = os.path.join(image_dir, f"{flag}--step{t:02d}.png")
    if not os.path.exists(dst):
      Image.fromarray(np.asarray(store.load_image(s.image_path))).save(dst)
  turns = [(s.obs_text, s.action_text) for s in traj.steps]
  rel = os.path.basename(os.path.normpath(image_dir))
  return [{"id": f"{flag}--step{t:02d}",
           "images": [f"{rel}/{flag}--step{i:02d}.png" for i in openwebvoyager.image_window(t, n_steps)],
           "conversations": conv}
          for t, conv in enumerate(openwebvoyager.conversations(turns, n_steps), start=1)]


def successful_samples(store: TrajectoryStore, out_dir: str, n_steps: int = openwebvoyager.LAST_N) -> dict:
  """`out_dir/samples.json` (+ `out_dir/images/`) from the successful trajectories of `store` (the filter of
  §2.4: only judged successes are trained on). Returns counts."""
  samples, n_traj = [], 0
  for traj in rollout.episodes(store):  # every process's shard, the last record of each episode
    if traj.success == 1.0 and traj.steps:
      samples.extend(trajectory_samples(traj, store, os.path.join(out_dir, "images"), n_steps))
      n_traj += 1
  for s in samples:
    conversation.validate(s)
  if distributed.is_main():
    write_json(os.path.join(out_dir, "samples.json"), samples)
  return {"trajectories": n_traj, "samples": len(samples)}


def load_samples(stage_dir: str) -> list[dict]:
  return conversation.load_conversations(os.path.join(stage_dir, "samples.json"))


def convert_released(root: str, out_path: str) -> dict:
  """OpenWebVoyager's released WebVoyager-4o result folders (`task*/` with `interact_messages.json`,
  `accessibility_tree{i}.txt`, `screenshot{i}.png`, `agent.log`) → one OWV JSON with images copied beside it,
  keeping finished tasks (`INFO - finish!!` in `agent.log`), as `convert_trajectories_to_json.py` does."""
  import shutil  # pylint: disable=g-import-not-at-top
  image_dir = os.path.join(os.path.dirname(os.path.abspath(out_path)), "images")
  os.makedirs(image_dir, exist_ok=True)
  samples, kept, skipped = [], 0, 0
  for name in sorted(os.listdir(root), key=openwebvoyager.sort_key):
    task_dir = os.path.join(root, name)
    log = os.path.join(task_dir, "agent.log")
    if not os.path.isdir(task_dir) or not name.startswith("task"):
      continue
    if not os.path.exists(log) or "INFO - finish!!" not in open(log, encoding="utf-8").read():
      skipped += 1
      continue
    flag = openwebvoyager.flag_id_for(name, 0)
    items = openwebvoyager.convert_task_dir(task_dir, flag)
    n = len([p for p in os.listdir(task_dir) if p.endswith(".png")])
    for t in range(1, n + 1):
      shutil.copyfile(os.path.join(task_dir, f"screenshot{t}.png"), os.path.join(image_dir, f"{flag}--step{t:02d}.png"))
    for item in items:
      item["images"] = [f"images/{p}" for p in item["images"]]
    samples.extend(items)
    kept += 1
  write_text(out_path, json.dumps(samples, ensure_ascii=False))
  return {"tasks": kept, "unfinished_skipped": skipped, "samples": len(samples)}


# ----------------------------------------------------------------------------------------- mixing


def mix(sources: Mapping[str, Sequence[dict]], weights: Mapping[str, float], seed: int) -> list[dict]:
  """The training set of one iteration: each source's samples taken `weight` times (§2.4's data-mixing knob:
  1.0 = all of it, 0.5 = a seeded half, 2.0 = twice, 0 = none). Sources are named `il`, `iter1`, `iter2`, ...;
  `weights` maps a name to its weight. Deterministic in `seed`; order is shuffled."""
  rng = random.Random(seed)
  out: list[dict] = []
  for name, items in sources.items():
    if name not in weights:
      raise ValueError(f"data source {name!r} has no mixing weight; give one in config.mix (have {sorted(weights)})")
    w = float(weights[name])
    if w < 0:
      raise ValueError(f"config.mix weight of {name!r} is {w}; weights must be >= 0")
    whole, frac = int(w), w - int(w)
    out.extend(list(items) * whole)
    if frac > 0 and items:
      out.extend(rng.sample(list(items), int(round(frac * len(items)))))
  rng.shuffle(out)
  return out


def mix_weights(config, iteration: int) -> dict[str, float]:
  """`config.mix` for iteration k: `il`, `previous` (each earlier iteration's data) and `current` weights."""
  w = {"il": float(config.mix.il), f"iter{iteration}": float(config.mix.current)}
  for j in range(1, iteration):
    w[f"iter{j}"] = float(config.mix.previous)
  return w
