"""Digi-Q's data stages: the task suites, the expert's demonstrations as AutoUI samples, behaviour rollouts and
the N−1 extra candidate actions per state (`reference/algorithms.md` §5.1 steps 1–4)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Sequence

from jaxagent import types
from jaxagent.agents import autoui
from jaxagent.data.store import TrajectoryStore
from jaxagent.recipes.digiq_stages import common


# -------------------------------------------------------------------------------------------- tasks


def select_tasks(config) -> dict[str, list[types.Task]]:
  """The device-profile suites (phone, AitW action space) of the chosen template families, `max_steps` capped."""
  from jaxagent.envs import sites  # pylint: disable=g-import-not-at-top
  return sites.select(config.seed, "device", config.tasks.templates, config.tasks.max_steps)


def episodes(tasks: Sequence[types.Task], n: int, seed: int, tag: str) -> list[types.Task]:
  """`n` episodes drawn from `tasks` with a fixed seed: a shuffled pass, repeated when n > len(tasks); ids are
  `<task id>@<tag><k>` so that every episode is unique in its store (and resumable by id)."""
  rng = random.Random(seed)
  out: list[types.Task] = []
  while len(out) < n:
    order = list(tasks)
    rng.shuffle(order)
    out.extend(order[:n - len(out)])
  return [dataclasses.replace(t, id=f"{t.id}@{tag}{k}") for k, t in enumerate(out)]


def write_tasks(out_dir: str, suites: dict[str, list[types.Task]]) -> dict[str, int]:
  for split, tasks in suites.items():
    with open(os.path.join(out_dir, f"{split}.jsonl.tmp"), "w", encoding="utf-8") as f:
      for t in tasks:
        f.write(json.dumps(t.to_json()) + "\n")
    os.replace(os.path.join(out_dir, f"{split}.jsonl.tmp"), os.path.join(out_dir, f"{split}.jsonl"))
  return {split: len(tasks) for split, tasks in suites.items()}


def read_tasks(path: str) -> list[types.Task]:
  with open(path, encoding="utf-8") as f:
    return [types.Task.from_json(json.loads(line)) for line in f if line.strip()]


# --------------------------------------------------------------------------------- demonstrations


def expert_rollout(config, store_dir: str, tasks: Sequence[types.Task]) -> list[types.Trajectory]:
  from jaxagent.envs.sites import expert  # pylint: disable=g-import-not-at-top
  return common.rollout(config, store_dir, expert.ScriptedExpert("autoui"), tasks, "scripted_expert:autoui",
                        expert=True)


def step_samples(trajs: Sequence[types.Trajectory], store: TrajectoryStore, image_dir: str,
                 only_success: bool = True) -> list[dict]:
  """AutoUI samples (1/4 screenshot + `Previous Actions: ... Goal: ...</s>` → the action string) of every step."""
  os.makedirs(image_dir, exist_ok=True)
  items = []
  for traj in trajs:
    if only_success and traj.success != 1.0:
      continue
    for s in traj.steps:
      if not s.image_path or not s.action_text:
        continue
      name = f"{traj.meta.get('episode_id', traj.task.id)}-{s.step}.png".replace("/", "_")
      path = common.save_png(os.path.join(image_dir, name), common.small_screen(store.load_image(s.image_path)))
      items.append(common.sample_item(f"{traj.task.id}-{s.step}", path, s.obs_text, s.action_text))
  return items


# ---------------------------------------------------------------------------------- more actions


def sample_candidates(actor, prompts: Sequence[str], images, n: int, temperature: float, resample: int
                      ) -> list[list[str]]:
  """For each state, n−1 actions sampled at `temperature`; an invalid one (`autoui.is_action_valid`) is
  resampled up to `resample` times, then kept (§5.1 step 4). One batched call per resampling round."""
  out = [[None] * (n - 1) for _ in prompts]
  todo = [(i, k) for i in range(len(prompts)) for k in range(n - 1)]
  for attempt in range(resample + 1):
    if not todo:
      break
    texts = actor.generate([prompts[i] for i, _ in todo], [images[i] for i, _ in todo], temperature)
    left = []
    for (i, k), text in zip(todo, texts):
      out[i][k] = text
      if not autoui.is_action_valid(text) and attempt < resample:
        left.append((i, k))
    todo = left
  return out


def add_candidates(config, actor, trajs: Sequence[types.Trajectory], src: TrajectoryStore, out_store_dir: str,
                   chunk: int = 16) -> list[types.Trajectory]:
  """Copies each behaviour trajectory into a new store with `Step.candidates = [dataset action] + n−1 samples`.
  The states of `chunk` trajectories share the sampler calls; trajectories already copied (a killed run) are
  skipped."""
  out = TrajectoryStore(out_store_dir)
  done = common.stored_ids(out)
  todo = [t for t in trajs if t.task.id not in done]
  n = int(config.candidates.n)
  for start in range(0, len(todo), chunk):
    group = todo[start:start + chunk]
    steps = [s for t in group for s in t.steps if s.image_path]
    images = [common.small_screen(src.load_image(s.image_path)) for s in steps]
    extra = sample_candidates(actor, [s.obs_text for s in steps], images, n, float(config.candidates.temperature),
                              int(config.candidates.resample))
    for s, cands in zip(steps, extra):
      s.candidates = [s.action_text] + cands
    for traj in group:
      _copy_into(out, traj, src)
  out.refresh()
  return [out.read(i) for i in range(len(out))]


def _copy_into(out: TrajectoryStore, traj: types.Trajectory, src: TrajectoryStore) -> None:
  """Appends `traj` to `out` with its screenshots (the store writes them from the observations)."""
  shots = [src.load_image(s.image_path) if s.image_path else None for s in traj.steps]
  last = traj.steps[-1].next_image_path if traj.steps else None
  for s, shot in zip(traj.steps, shots):
    s.observation = types.Observation(url=s.url, screenshot=shot)
  traj.final_observation = types.Observation(url="", screenshot=src.load_image(last)) if last else None
  out.append(traj)
