"""Digi-Q's samples: the AutoUI prompt the VLM sees, demonstrations and chosen states as training samples, and the
N−1 extra candidate actions per state (`reference/algorithms.md` §5.1 steps 2–4, §5.5).

The VLM sees the 1/4-resolution screenshot (Digi-Q's `smaller_images/`) and the AutoUI prompt
(`Previous Actions: … Goal: …</s>`), as one human turn `<image>\\n<prompt>`; the same turn is what it is
trained on (`sample`) and prompted with when acting (`prompt_fn`, through `pipeline.policy.VLMPolicy`).
"""

from __future__ import annotations

import os
from typing import Sequence

from jaxagent import types
from jaxagent.agents import autoui
from jaxagent.data.store import TrajectoryStore
from jaxagent.data.tokenizer import IMAGE_TOKEN
from jaxagent.pipeline.rollout import stored_ids
from jaxagent.pipeline.stages import save_png
from jaxagent.proj.digiq.screens import downscale

FORMAT = autoui.AutoUI()


def turn(prompt: str) -> list[dict]:
  """The one human turn: the screen's image, then the AutoUI prompt."""
  return [{"from": "human", "value": f"{IMAGE_TOKEN}\n{prompt}"}]


def prompt_fn(observation: types.Observation, history: Sequence[types.Step]) -> tuple[list[dict], list]:
  """`VLMPolicy`'s prompt: the AutoUI prompt of this step over the 1/4 screenshot."""
  return turn(FORMAT.build_prompt(observation.intent, observation, history)), [downscale(observation.screenshot)]


def sample(sample_id: str, image_path: str, prompt: str, answer: str, weight: float = 1.0) -> dict:
  """A training sample: `turn(prompt)` → the action string, weighted."""
  return {"id": sample_id, "images": [image_path], "weight": float(weight),
          "conversations": turn(prompt) + [{"from": "gpt", "value": answer}]}


def step_samples(trajs: Sequence[types.Trajectory], store: TrajectoryStore, image_dir: str,
                 only_success: bool = True) -> list[dict]:
  """A sample of every step of (the successful) `trajs`, its 1/4 screenshot written under `image_dir`."""
  os.makedirs(image_dir, exist_ok=True)
  items = []
  for traj in trajs:
    if only_success and traj.success != 1.0:
      continue
    for s in traj.steps:
      if not s.image_path or not s.action_text:
        continue
      name = f"{traj.meta.get('episode_id', traj.task.id)}-{s.step}.png".replace("/", "_")
      path = save_png(os.path.join(image_dir, name), downscale(store.load_image(s.image_path)))
      items.append(sample(f"{traj.task.id}-{s.step}", path, s.obs_text, s.action_text))
  return items


def state_samples(store: TrajectoryStore, trajs: Sequence[types.Trajectory], picks, image_dir: str) -> list[dict]:
  """Samples of dataset states: for each pick (trajectory i, step k, action string, weight) the state's
  1/4 screenshot (written under `image_dir`), its AutoUI prompt and that action."""
  os.makedirs(image_dir, exist_ok=True)
  items = []
  for i, k, action, weight in picks:
    step = trajs[i].steps[k]
    path = save_png(os.path.join(image_dir, f"{i}-{k}.png"), downscale(store.load_image(step.image_path)))
    items.append(sample(f"{i}-{k}", path, step.obs_text, action, weight))
  return items


def filtered_bc_samples(store: TrajectoryStore, trajs: Sequence[types.Trajectory], image_dir: str) -> list[dict]:
  """The paper's Filtered BC baseline (§5.8, "AutoUI + Filtered BC"): every step of the successful trajectories
  with its dataset action, weight 1."""
  picks = [(i, k, step.action_text, 1.0) for i, t in enumerate(trajs) if t.success == 1.0
           for k, step in enumerate(t.steps) if step.image_path]
  return state_samples(store, trajs, picks, image_dir)


# ---------------------------------------------------------------------------------- more actions


def sample_candidates(policy, prompts: Sequence[str], images, n: int, temperature: float, resample: int
                      ) -> list[list[str]]:
  """For each state, n−1 actions sampled at `temperature`; an invalid one (`autoui.is_action_valid`) is
  resampled up to `resample` times, then kept (§5.1 step 4). One batched call per resampling round."""
  out = [[None] * (n - 1) for _ in prompts]
  todo = [(i, k) for i in range(len(prompts)) for k in range(n - 1)]
  for attempt in range(resample + 1):
    if not todo:
      break
    texts = policy.generate([turn(prompts[i]) for i, _ in todo], [[images[i]] for i, _ in todo], temperature)
    left = []
    for (i, k), text in zip(todo, texts):
      out[i][k] = text
      if not autoui.is_action_valid(text) and attempt < resample:
        left.append((i, k))
    todo = left
  return out


def add_candidates(candidates, policy, trajs: Sequence[types.Trajectory], src: TrajectoryStore,
                   out_store_dir: str, chunk: int = 16) -> list[types.Trajectory]:
  """Copies each trajectory into a new store with `Step.candidates = [dataset action] + n−1 samples`
  (`candidates`: `config.candidates`). The states of `chunk` trajectories share the sampler calls; trajectories
  already copied (a killed run) are skipped."""
  out = TrajectoryStore(out_store_dir)
  done = stored_ids(out)
  todo = [t for t in trajs if t.task.id not in done]
  for start in range(0, len(todo), chunk):
    group = todo[start:start + chunk]
    steps = [s for t in group for s in t.steps if s.image_path]
    images = [downscale(src.load_image(s.image_path)) for s in steps]
    extra = sample_candidates(policy, [s.obs_text for s in steps], images, int(candidates.n),
                              float(candidates.temperature), int(candidates.resample))
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
