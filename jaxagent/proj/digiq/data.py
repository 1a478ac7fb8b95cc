"""Digi-Q's data: the N−1 extra candidate actions per state (`reference/algorithms.md` §5.1 step 4) and the
Filtered BC control's samples (§5.8). The AutoUI prompt and samples are the device recipes' shared
`pipeline.device`."""

from __future__ import annotations

from typing import Sequence

from jaxagent import types
from jaxagent.agents import autoui
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import distributed
from jaxagent.pipeline.device import downscale, state_samples, turn
from jaxagent.pipeline.rollout import stored_ids


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
    texts = policy.generate_turns([turn(prompts[i]) for i, _ in todo], [[images[i]] for i, _ in todo], temperature)
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
  already copied (a killed run) are skipped. Under several processes process 0 writes the store, the others
  wait for it."""
  out = TrajectoryStore(out_store_dir)
  done = stored_ids(out)
  todo = [t for t in trajs if t.task.id not in done] if distributed.is_main() else []
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
  distributed.barrier("digiq.add_candidates")
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
