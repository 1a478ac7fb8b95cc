"""Screenshots as the agent formats hand them to a model: the `<image>` marker and the seeds' downscaled copies."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from PIL import Image

from jaxagent.tokens import IMAGE_TOKEN  # noqa: F401  # re-exported for the formats

SCREEN_SCALE = 0.25  # Digi-Q §5.1 steps 2 and 5, DigiRL: 1/4-resolution copies of the screenshots

ImageLike = Any  # np.ndarray [H, W, 3] uint8 | PIL.Image.Image | a path


def to_pil(image: ImageLike) -> Image.Image:
  if isinstance(image, Image.Image):
    return image.convert("RGB")
  if isinstance(image, (str, os.PathLike)):
    with Image.open(image) as im:
      return im.convert("RGB")
  arr = np.asarray(image)
  if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[-1] not in (3, 4):
    raise ValueError(f"screenshot: expected uint8 [H, W, 3|4], got {arr.dtype} {arr.shape}")
  return Image.fromarray(arr).convert("RGB")


def downscale(image: ImageLike, factor: float = SCREEN_SCALE) -> np.ndarray:
  """`img.resize((int(w * f), int(h * f)))` with PIL's default filter, as the seeds' scripts call it."""
  img = to_pil(image)
  return np.asarray(img.resize((int(img.width * factor), int(img.height * factor))))
