"""Digi-Q's data utilities: screen-change labels, the cursor overlay, representation fine-tuning samples.

All numpy/PIL, host side (`reference/algorithms.md` §5.1–5.2):
  * `screen_change_label`: "Yes" iff the mean squared pixel difference of the 1/4-downscaled screenshots of
    s and s' exceeds 30 (`postprocess_data/get_more_actions/construct_sft_data.py:judge`, on the
    `smaller_images/` copies of `generate_smaller_images.py`).
  * `overlay_cursor`: a click icon centred at a tap's touch point, then the 1/4 downscale
    (`generate_more_click_images_batched.py`, `digiq/models/autoui_agent.py:add_cursor`). The seeds paste
    `assets/click.png` at 250×250; we draw an icon procedurally (`click_icon`), so nothing is downloaded.
  * `representation_sample` / `build_representation_dataset`: the "does this action change the screen"
    fine-tuning set (`construct_sft_data.py`) in the OpenWebVoyager conversation format the IL pipeline
    reads (`{"id", "images", "conversations"}`, `jaxagent/data/conversation.py`), with the §5.2 prompt per
    action type from `jaxagent.agents.autoui` (whose `actionable_label` and `digiq_parse_action` we reuse).
"""

from __future__ import annotations

import ast
import functools
import json
import os
from typing import Any, Callable, Iterable

import numpy as np
from PIL import Image, ImageDraw

from jaxagent import types
from jaxagent.agents import autoui
from jaxagent.pipeline.device import DOWNSCALE, ImageLike, downscale
from jaxagent.pipeline.device import to_pil as _to_pil

SCREEN_CHANGE_THRESHOLD = 30.0  # §5.2, `judge`: `diff > 30`
SEED_ICON_SIZE = 250  # §5.1 step 5: the click icon is pasted at 250×250 px ...
SEED_SCREEN_WIDTH = 1080  # ... on the emulator's full-resolution screenshots (assumed 1080 px wide)

# ----------------------------------------------------------------------------------- screen change


def screen_change_label(image: ImageLike, next_image: ImageLike, threshold: float = SCREEN_CHANGE_THRESHOLD,
                        factor: float | None = DOWNSCALE) -> str:
  """"Yes" iff the action changed the screen: mean((small(s) − small(s'))²) > 30, else "No" (§5.2).

  Downscales both screenshots by `factor` (the seeds compare their `smaller_images/` copies; `factor=None`
  takes images that are already small) and applies `autoui.actionable_label` (`construct_sft_data.py:judge`).
  """
  a, b = (np.asarray(_to_pil(x)) if factor is None else downscale(x, factor) for x in (image, next_image))
  if a.shape != b.shape:
    raise ValueError(f"screen_change_label: screenshots differ in size {a.shape} vs {b.shape}; both must "
                     "come from the same device profile")
  return autoui.actionable_label(a, b, threshold)


# ------------------------------------------------------------------------------------ cursor overlay


@functools.lru_cache(maxsize=8)
def click_icon(size: int = SEED_ICON_SIZE) -> Image.Image:
  """A procedurally drawn RGBA click marker (stand-in for the seeds' `assets/click.png`).

  A dark-outlined red ring, a crosshair and a filled centre dot on a transparent background, so it stays
  visible on light and dark screens and its centre marks the touch point exactly.
  """
  if size < 4:
    raise ValueError(f"click_icon: size={size} px is too small to draw; use >= 4")
  img = Image.new("RGBA", (size, size), (0, 0, 0, 0))
  d = ImageDraw.Draw(img)
  c, r = (size - 1) / 2, (size - 1) / 2
  w = max(1, size // 16)
  d.ellipse([c - r, c - r, c + r, c + r], outline=(20, 20, 20, 255), width=w + 2)
  d.ellipse([c - r + 1, c - r + 1, c + r - 1, c + r - 1], outline=(230, 30, 30, 255), width=w)
  d.line([(c, c - r * 0.7), (c, c + r * 0.7)], fill=(230, 30, 30, 230), width=w)
  d.line([(c - r * 0.7, c), (c + r * 0.7, c)], fill=(230, 30, 30, 230), width=w)
  dot = max(1.5, r * 0.22)
  d.ellipse([c - dot, c - dot, c + dot, c + dot], fill=(230, 30, 30, 255), outline=(20, 20, 20, 255))
  return img


def parse_action(action_text: str) -> dict[str, Any] | None:
  """Digi-Q's `parsed_action` (`postprocess_data/get_more_actions/generate_more_click_images_batched.py:
  parse_action`, stored as `parsed_action_list` and read by `construct_sft_data.py:make_prompt` and both
  extraction paths): the four fields by regex, `touch_point` / `lift_point` replaced by their
  `ast.literal_eval` value (a 2-element list or tuple, e.g. "[0.1650, 0.5000]" -> [0.165, 0.5]), the others
  kept as strings. None when a field is missing or a point does not parse to two items."""
  fields: dict[str, Any] = dict(autoui.digiq_parse_action(action_text))
  if any(v is None for v in fields.values()):
    return None
  for key in ("touch_point", "lift_point"):
    try:
      points = ast.literal_eval(fields[key])
    except Exception:  # pylint: disable=broad-except  # the seeds catch ValueError/SyntaxError (others crash)
      return None
    if not isinstance(points, (list, tuple)) or len(points) != 2:
      return None
    fields[key] = points
  return fields


def _parse_points(action_text: str, width: int, height: int):
  """(parsed fields, touch (y, x) px, lift (y, x) px), or None when the action does not parse (`parse_action`)
  — `process_image` then keeps the screenshot and records `parsed_action = None`."""
  fields = parse_action(action_text)
  if fields is None:
    return None
  try:
    touch, lift = fields["touch_point"], fields["lift_point"]
    return fields, (int(touch[0] * height), int(touch[1] * width)), (int(lift[0] * height), int(lift[1] * width))
  except Exception:  # pylint: disable=broad-except  # non-numeric points (the seeds' script would crash)
    return None


def tap_pixel(action_text: str, width: int, height: int) -> tuple[int, int] | None:
  """(x, y) in pixels when the AutoUI action is a tap — DUAL_POINT with touch == lift after scaling to pixels —
  else None (`add_cursor`: `touch_point = (int(ty * H), int(tx * W))`, points are normalised [y, x])."""
  parsed = _parse_points(action_text, width, height)
  if parsed is None:
    return None
  fields, touch, lift = parsed
  if touch == lift and fields["action_type"] == "DUAL_POINT":
    return touch[1], touch[0]
  return None


def default_icon_size(width: int) -> int:
  """The seeds' 250 px icon scaled to this screenshot's width (250 on a 1080-px-wide screen)."""
  return max(8, round(SEED_ICON_SIZE * width / SEED_SCREEN_WIDTH))


def overlay_cursor(image: ImageLike, action_text: str, icon_size: int | None = None,
                   factor: float = DOWNSCALE) -> np.ndarray:
  """The Q-image of (s, a): the click icon centred at a tap's touch point, then downscaled by `factor` (§5.1.5).

  Non-tap actions (swipes, TYPE, buttons, unparsable text) are only downscaled, as in `add_cursor`.
  `icon_size=None` scales the seeds' 250 px to the screenshot (`default_icon_size`).
  """
  img = _to_pil(image)
  tap = tap_pixel(action_text, img.width, img.height)
  if tap is not None:
    size = icon_size or default_icon_size(img.width)
    icon = click_icon(size)
    img.paste(icon, (tap[0] - size // 2, tap[1] - size // 2), icon)
  return np.asarray(img.resize((int(img.width * factor), int(img.height * factor))))


# ----------------------------------------------------------------------- representation fine-tuning


def representation_prompt(action_text: str) -> str:
  """The §5.2 question for this action (`autoui.actionable_prompt` of `parse_action`); the generic one when
  the action does not parse, as `make_prompt` then gets `parsed_action = None`.

  The touch point is written as Python prints the parsed value, `str(ast.literal_eval(...))`, as the seeds'
  f-string does: "[0.1650, 0.5000]" in the action becomes "[0.165, 0.5]" in the prompt."""
  parsed = _parse_points(action_text, 1, 1)
  return autoui.actionable_prompt(parsed[0] if parsed is not None else None)


def representation_query(image: ImageLike, action_text: str, icon_size: int | None = None
                         ) -> tuple[np.ndarray, str]:
  """(Q-image, prompt) for one (state, candidate action): what the VLM sees when fine-tuned and when its
  (s, a) representation is extracted (§5.1 steps 5–8)."""
  return overlay_cursor(image, action_text, icon_size), representation_prompt(action_text)


def representation_sample(sample_id: str, image_path: str, prompt: str, answer: str) -> dict[str, Any]:
  """One fine-tuning sample `{"id", "images": [q_image], "conversations": [human prompt, gpt Yes/No]}`."""
  if answer not in ("Yes", "No"):
    raise ValueError(f"representation_sample {sample_id!r}: answer must be 'Yes' or 'No', got {answer!r}")
  if prompt.count("<image>") != 1:
    raise ValueError(f"representation_sample {sample_id!r}: the prompt needs exactly one <image> placeholder")
  return {"id": sample_id, "images": [image_path],
          "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}]}


def build_representation_dataset(trajectories: Iterable[types.Trajectory],
                                 load_image: Callable[[str], np.ndarray], out_dir: str,
                                 icon_size: int | None = None) -> str:
  """Writes `out_dir/representation_sft.json` and its Q-images; returns the JSON path.

  One sample per dataset step (s, a, s') with both screenshots: the cursor image of (s, a), the §5.2 prompt
  and the label "Yes" iff s' differs from s (`construct_sft_data.py`). `load_image(rel_path)` reads a step's
  `image_path` / `next_image_path` (e.g. `TrajectoryStore.load_image`). Sample ids are
  `{episode}-{step}` (`{traj_id}-{step_id}` in the seeds). Steps without a next screenshot are skipped.
  """
  image_dir = os.path.join(out_dir, "images")
  os.makedirs(image_dir, exist_ok=True)
  samples = []
  for n, traj in enumerate(trajectories):
    episode = str(traj.meta.get("episode_id", traj.meta.get("traj_id", n)))
    for step in traj.steps:
      if not step.image_path or not step.next_image_path or not step.action_text:
        continue
      screen = load_image(step.image_path)
      label = screen_change_label(screen, load_image(step.next_image_path))
      q_image, prompt = representation_query(screen, step.action_text, icon_size)
      name = f"{episode}-{step.step}.png"
      image_tmp = os.path.join(image_dir, f".{name}.tmp{os.getpid()}")
      Image.fromarray(q_image).save(image_tmp, format="PNG")
      os.replace(image_tmp, os.path.join(image_dir, name))
      samples.append(representation_sample(f"{episode}-{step.step}", f"images/{name}", prompt, label))
  path = os.path.join(out_dir, "representation_sft.json")
  tmp = f"{path}.tmp{os.getpid()}"  # each process of a multi-host run writes the same files: its own temporary
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(samples, f)
  os.replace(tmp, path)  # a killed run never leaves a half-written dataset behind
  return path
