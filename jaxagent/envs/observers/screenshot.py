"""Screenshots as uint8 [H, W, 3] arrays, in CSS pixels (device scale factor undone) or resized."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def png_to_array(png: bytes, size: tuple[int, int] | None = None) -> np.ndarray:
  """Decodes a PNG to RGB uint8; `size` = (width, height) resizes it (bilinear)."""
  image = Image.open(io.BytesIO(png)).convert("RGB")
  if size is not None and image.size != tuple(size):
    image = image.resize(tuple(size), Image.BILINEAR)
  return np.asarray(image, dtype=np.uint8)


def capture(page, size: tuple[int, int] | None = None) -> np.ndarray:
  """The visible viewport of `page`, one pixel per CSS pixel unless `size` asks for another size."""
  # caret="initial" leaves the text caret as the page draws it (as the originals' screenshots do) and saves
  # Playwright a style injection round trip per shot.
  return png_to_array(page.screenshot(type="png", scale="css", caret="initial"), size)
