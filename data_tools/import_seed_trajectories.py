"""Import the seeds' DigiRL / Digi-Q `.pt` trajectory files into a jaxagent `TrajectoryStore`.

    python -m data_tools.import_seed_trajectories --pt general-1008trajs.pt --store /data/digiq_seed \
        [--images-root /data/images] [--limit 100] [--gamma 0.95]

A seed file is `torch.save(list[list[dict]])` (`reference/algorithms.md` §4.9, §5.6). Each step dict becomes a
`jaxagent.types.Step`:
  observation → obs_text, action → action_text (and `action`, parsed by `agents.autoui`), reward / done / mc_return as they are, `action_list`
  ("<split>"-joined, index 0 = dataset action) → candidates, every other JSON-able field → `Step.info`
  (next_observation, trajectory_reward, traj_id, step_id, parsed_action(_list), q_response(_list), ...).
  Arrays (image_features [1408], q_rep_out [4096], q_rep_out_list [N, 4096], ...) go to one `.npz` per
  episode under `<store>/features/`; `Step.info["features_file"]` names it and `load_step_features` reads a
  step's arrays back. Screenshots that can be found (as stored, or by file name under `--images-root`) are
  copied into the store; otherwise the seed's path is kept in `image_path`.
DigiRL's collector stored the NEXT screenshot under `image_path` (§5.1 step 3); for files without
`next_image_path` the importer shifts them as Digi-Q's `redirect_image_paths.py` does, so that `image_path` is
always the state the step acted on, and step 0's is the reset screenshot the env saved beside the others
(`<id>_0.png` before `<id>_1.png`; `reset_screenshot_path`). Re-importing a file skips the episodes already in the store.

torch is needed only to unpickle (a test-only dependency; it is imported lazily).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import uuid
from typing import Any, Sequence

import numpy as np

from jaxagent import types
from jaxagent.agents import autoui
from jaxagent.data.store import TrajectoryStore
from jaxagent.rl import returns

FEATURES_DIR = "features"
_SPLIT = "<split>"
# Fields that map onto Step attributes rather than Step.info.
# The seeds' env turned an unsplittable action into TaskImpossible (§4.3); keep that reading of their data.
_AUTOUI = autoui.AutoUI(faithful_task_impossible=True)
_STEP_FIELDS = ("observation", "action", "reward", "done", "mc_return", "image_path", "next_image_path",
                "action_list", "task")


def _torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("import_seed_trajectories needs PyTorch to unpickle the seeds' .pt files: "
                      "`pip install torch` (or `pip install -e .[test]`)") from e
  return torch


def load_seed_file(path: str) -> list[list[dict[str, Any]]]:
  """The seed file's trajectories (`torch.load(weights_only=False)`: they pickle numpy arrays and dicts)."""
  data = _torch().load(path, weights_only=False, map_location="cpu")
  if not isinstance(data, list) or not all(isinstance(t, list) for t in data):
    raise ValueError(f"{path}: expected a list of trajectories (lists of step dicts), as DigiRL/Digi-Q save "
                     f"them; got {type(data).__name__}")
  for i, traj in enumerate(data):
    for j, step in enumerate(traj):
      missing = [k for k in ("observation", "action", "reward", "done", "task") if k not in step]
      if missing:
        raise ValueError(f"{path}: trajectory {i} step {j} lacks {missing}; not a DigiRL/Digi-Q trajectory file")
  return data


def _as_numpy(x: Any) -> Any:
  if hasattr(x, "detach") and hasattr(x, "numpy"):  # a torch tensor
    return x.detach().cpu().numpy()
  return x


def _is_array(x: Any) -> bool:
  return isinstance(x, np.ndarray) and x.ndim > 0


def _find_image(path: str | None, images_root: str | None) -> str | None:
  if not path:
    return None
  if os.path.isfile(path):
    return path
  if images_root:
    candidate = os.path.join(images_root, os.path.basename(path))
    if os.path.isfile(candidate):
      return candidate
  return None


def _read_png(path: str | None) -> np.ndarray | None:
  if path is None:
    return None
  from PIL import Image  # pylint: disable=g-import-not-at-top

  with Image.open(path) as im:
    return np.asarray(im.convert("RGB"))


def reset_screenshot_path(next_path: str | None) -> str | None:
  """The episode's first screenshot, named from step 0's next one: DigiRL's env saves every observation as
  `{temp_path}/{image_id}_{steps}.png`, the reset's with steps = 0 and step t's next with steps = t + 1
  (`digirl/environment/android/env.py:get_obs`), so `<id>_1.png` follows `<id>_0.png`. None for other names."""
  match = re.fullmatch(r"(.*_)(\d+)(\.png)", next_path or "")
  if match is None or int(match.group(2)) < 1:
    return None
  return f"{match.group(1)}{int(match.group(2)) - 1}{match.group(3)}"


def _image_paths(raw: list[dict[str, Any]]) -> list[tuple[str | None, str | None]]:
  """(current, next) screenshot path per step; DigiRL files store the next one under `image_path`, and the
  first state's path is the reset screenshot's (`reset_screenshot_path`)."""
  if all("next_image_path" in s for s in raw):
    return [(s.get("image_path"), s.get("next_image_path")) for s in raw]
  nxt = [s.get("image_path") for s in raw]
  return [(nxt[i - 1] if i else reset_screenshot_path(nxt[0]), nxt[i]) for i in range(len(raw))]


def convert_trajectory(raw: list[dict[str, Any]], *, source: str, index: int, features_root: str | None,
                       images_root: str | None = None, gamma: float | None = None) -> types.Trajectory:
  """One seed trajectory → `types.Trajectory`; arrays written to `features_root/<name>.npz` when given.

  `gamma` recomputes `mc_return` from the rewards (`rl.returns.mc_return`), as both trainers do at load
  (`add_mc_return(γ)`: 0.5 for DigiRL, 0.95 for Digi-Q); None keeps the file's values.
  """
  if not raw:
    raise ValueError(f"{source}: trajectory {index} is empty")
  paths = _image_paths(raw)
  traj_id = raw[0].get("traj_id", index)
  task = types.Task(id=f"{os.path.basename(source)}/{traj_id}", intent=str(raw[0]["task"]), site="aitw",
                    start_url="", profile="device", max_steps=len(raw), split="train")
  arrays: dict[str, np.ndarray] = {}
  feature_name = f"{uuid.uuid4().hex}.npz"
  steps = []
  for t, s in enumerate(raw):
    info: dict[str, Any] = {}
    for key, value in s.items():
      if key in _STEP_FIELDS:
        continue
      value = _as_numpy(value)
      if _is_array(value):
        arrays[f"{t}/{key}"] = value
        info.setdefault("feature_keys", []).append(key)
      else:
        info[key] = value.item() if isinstance(value, np.generic) else value
    if "feature_keys" in info and features_root is not None:
      info["features_file"] = f"{FEATURES_DIR}/{feature_name}"
      info["features_prefix"] = f"{t}/"
    cur, nxt = paths[t]
    info["seed_image_path"], info["seed_next_image_path"] = cur, nxt
    shot = _read_png(_find_image(cur, images_root))
    candidates = s["action_list"].split(_SPLIT) if isinstance(s.get("action_list"), str) else None
    steps.append(types.Step(
        step=int(s.get("step_id", t)), obs_text=str(s["observation"]), action_text=str(s["action"]),
        action=_AUTOUI.parse(str(s["action"])),
        reward=float(s["reward"]), done=bool(s["done"]), mc_return=float(s.get("mc_return", 0.0)),
        image_path=cur, next_image_path=nxt, info=info, candidates=candidates,
        observation=types.Observation(intent=task.intent, step=t, screenshot=shot)))
  if gamma is not None:
    for step, g in zip(steps, returns.mc_return(np.array([s.reward for s in steps], np.float32), gamma)):
      step.mc_return = float(g)
  traj_reward = float(raw[0].get("trajectory_reward", sum(float(s["reward"]) for s in raw)))
  final_shot = _read_png(_find_image(paths[-1][1], images_root))
  traj = types.Trajectory(
      task=task, steps=steps, success=1.0 if traj_reward > 0 else 0.0,
      verdict_reason="seed label (Gemini-1.5-Pro evaluator at collection)", policy="autoui-seed",
      meta={"seed_source": os.path.abspath(source), "seed_index": index, "traj_id": _as_numpy(traj_id),
            "seed_format": "digiq" if "q_rep_out" in raw[0] or "action_list" in raw[0] else "digirl"},
      final_observation=types.Observation(intent=task.intent, step=len(raw), screenshot=final_shot))
  if isinstance(traj.meta["traj_id"], np.generic):
    traj.meta["traj_id"] = traj.meta["traj_id"].item()
  if arrays and features_root is not None:
    os.makedirs(features_root, exist_ok=True)
    tmp = os.path.join(features_root, f".tmp-{feature_name}")
    with open(tmp, "wb") as f:
      np.savez(f, **arrays)
    os.replace(tmp, os.path.join(features_root, feature_name))
  return traj


def load_step_features(store_path: str, step: types.Step) -> dict[str, np.ndarray]:
  """The arrays the importer put beside a step (`image_features`, `q_rep_out_list`, ...), by field name."""
  keys = step.info.get("feature_keys", [])
  if not keys:
    return {}
  if "features_file" not in step.info:
    raise ValueError("load_step_features: this step's arrays were not written (imported without a store)")
  prefix = step.info["features_prefix"]
  with np.load(os.path.join(store_path, step.info["features_file"])) as z:
    return {k: z[prefix + k] for k in keys}


def import_seed_file(pt_path: str, store_path: str, *, images_root: str | None = None,
                     limit: int | None = None, gamma: float | None = None) -> list[str]:
  """Appends the file's trajectories to the store at `store_path`; returns the new episode ids."""
  store = TrajectoryStore(store_path)
  source = os.path.abspath(pt_path)
  imported = {t.meta.get("seed_index") for t in store if t.meta.get("seed_source") == source}
  raw = load_seed_file(pt_path)
  ids = []
  for i, traj in enumerate(raw[:limit] if limit else raw):
    if i in imported or not traj:
      continue
    converted = convert_trajectory(traj, source=pt_path, index=i,
                                   features_root=os.path.join(store_path, FEATURES_DIR), images_root=images_root,
                                   gamma=gamma)
    converted.meta["seed_source"] = source
    ids.append(store.append(converted))
  return ids


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--pt", required=True, help="a DigiRL or Digi-Q trajectory file (torch.save'd list)")
  parser.add_argument("--store", required=True, help="trajectory store directory (created if absent)")
  parser.add_argument("--images-root", default=None, help="where the seed's screenshots were unzipped")
  parser.add_argument("--limit", type=int, default=None, help="import only the first N trajectories")
  parser.add_argument("--gamma", type=float, default=None,
                      help="recompute mc_return with this discount (DigiRL 0.5, Digi-Q 0.95); default: keep the file's")
  args = parser.parse_args(argv)
  if not os.path.isfile(args.pt):
    parser.error(f"--pt {args.pt}: no such file")
  ids = import_seed_file(args.pt, args.store, images_root=args.images_root, limit=args.limit, gamma=args.gamma)
  print(f"imported {len(ids)} trajectories from {args.pt} into {args.store}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
