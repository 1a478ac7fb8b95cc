"""Metric writer: TensorBoard event files (tensorboardX, no TensorFlow) plus a `metrics.jsonl` line per write.

The interface follows clu's `MetricWriter` (write_scalars / write_texts / write_images / flush / close) so
recipes read the same as the flax examples; clu itself needs TensorFlow. Only process 0 writes.
"""

from __future__ import annotations

import json
import os
import time
from typing import Mapping

import jax
import numpy as np


class MetricWriter:

  def __init__(self, logdir: str, jsonl_name: str = "metrics.jsonl"):
    self.logdir = logdir
    self._active = jax.process_index() == 0
    self._tb = None
    self._jsonl = None
    if self._active:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      os.makedirs(logdir, exist_ok=True)
      self._tb = SummaryWriter(logdir=logdir, flush_secs=30)
      self._jsonl = open(os.path.join(logdir, jsonl_name), "a", encoding="utf-8")

  def write_scalars(self, step: int, scalars: Mapping[str, float]):
    if not self._active:
      return
    values = {k: float(np.asarray(v)) for k, v in scalars.items()}
    for k, v in values.items():
      self._tb.add_scalar(k, v, global_step=step)
    self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **values}) + "\n")
    self._jsonl.flush()

  def write_texts(self, step: int, texts: Mapping[str, str]):
    if self._active:
      for k, v in texts.items():
        self._tb.add_text(k, v, global_step=step)

  def write_images(self, step: int, images: Mapping[str, np.ndarray]):
    """Images as [H, W, 3] or [N, H, W, 3], uint8 or float in [0, 1]."""
    if not self._active:
      return
    for k, v in images.items():
      v = np.asarray(v)
      if v.ndim == 3:
        self._tb.add_image(k, v, global_step=step, dataformats="HWC")
      else:
        self._tb.add_images(k, v, global_step=step, dataformats="NHWC")

  def flush(self):
    if self._active:
      self._tb.flush()
      self._jsonl.flush()

  def close(self):
    if self._active:
      self._tb.close()
      self._jsonl.close()
      self._active = False


def read_jsonl(path: str) -> list[dict]:
  """The rows a `MetricWriter` wrote (tests and tools read runs back this way)."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
