"""The IL data pipeline on Grain: conversations → (shuffle, repeat) → tokenise + load images, once → batch.

A `grain.MapDataset` indexed in training order, so the position of its iterator (checkpointed with the model by
`train.loop`) fully determines what comes next: resumed runs see the batches an uninterrupted run would.
Batches are host numpy dicts; `train.step.put_batch` places them on the mesh.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

import grain
import jax
import numpy as np

from jaxagent.data import conversation, packing
from jaxagent.models import qwen_vl

# Per-sample scalars a sample may carry into its batch: a loss weight (weighted regression), and WebRL's
# advantage and reference log-probability (`train.losses.webrl_actor_loss`).
SCALAR_FIELDS = ("weight", "advantage", "ref_logp")
# What `il_dataset` keeps of encoded samples: ~20,000 of Digi-Q's (48 KiB each), ~550 of OpenWebVoyager's three
# 224² images; the rest are encoded at every use.
ENCODED_CACHE_BYTES = 1 << 30


def load_images(paths: list[str], preprocess) -> np.ndarray:
  """Images from disk through the vision tower's preprocessing (`models.vit.ImagePreprocessing`)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  images = []
  for path in paths:
    with Image.open(path) as img:
      images.append(img.convert("RGB"))
  return preprocess(images)


@dataclasses.dataclass
class EncodeSample:
  """Grain map: one validated conversation → fixed-shape arrays (+ images when `preprocess` is set).

  Images: `images` [max_images, S, S, 3] (the sample's images first, zero padding after) and `image_mask`
  [max_images]; a VLM loss compacts them into the flat order the model merges (`models.vlm.flat_images`).
  Qwen2.5-VL (`preprocess` a `qwen_vl.QwenImages`): `patches` [max_images, g², D] and `positions` [3, seq_len]
  (M-RoPE) instead of `images`.
  """
  tokenizer: object
  seq_len: int
  num_image_tokens: int = 1
  preprocess: Callable | None = None  # None: text only (no pixels loaded; image tokens stay plain ids)
  image_size: int = 0
  max_images: int = 3
  image_wrap_id: int | None = None  # idefics2: the token around each image's block

  def __call__(self, item: dict) -> dict:
    out, n_images = conversation.encode(item, self.tokenizer, self.seq_len, self.num_image_tokens,
                                         self.image_wrap_id)
    if self.preprocess is not None:
      if n_images > self.max_images:
        raise conversation.ConversationError(
            f"sample {item['id']!r}: {n_images} images but data.max_images={self.max_images}; raise it")
      pixels = load_images(item["images"][:n_images], self.preprocess)
      if isinstance(self.preprocess, qwen_vl.QwenImages):  # patches and M-RoPE positions instead of images
        out.update(self.preprocess.sample_arrays(pixels, out["input_ids"], out["attention_mask"], self.max_images))
      else:
        images = np.zeros((self.max_images, self.image_size, self.image_size, 3), np.float32)
        images[:n_images] = pixels
        out["images"] = images
        out["image_mask"] = np.arange(self.max_images) < n_images
    for key in SCALAR_FIELDS:  # absent: plain SFT
      if key in item:
        out[key] = np.float32(item[key])
    return out


class EncodeOnce:
  """`encode(items[i])` for a source index, kept after its first call while the kept arrays fit in `max_bytes`.

  A recipe's data set is small and read for many epochs (Digi-Q's IL ~20 times, its actors ~7), and decoding a
  screenshot, resizing it and tokenising cost more than the tiny model's step on the CPU. Encoding is a pure
  function of the item, so a kept sample is the one a fresh call returns; its arrays are read-only.
  """

  def __init__(self, items: list[dict], encode: Callable[[dict], dict], max_bytes: int = ENCODED_CACHE_BYTES):
    self.items, self.encode, self.max_bytes = items, encode, int(max_bytes)
    self.kept: dict[int, dict] = {}
    self.kept_bytes = 0
    self._lock = threading.Lock()

  def __call__(self, index: int) -> dict:
    index = int(index) % len(self.items)
    hit = self.kept.get(index)
    if hit is not None:
      return hit
    out = self.encode(self.items[index])
    size = sum(v.nbytes for v in out.values() if isinstance(v, np.ndarray))
    with self._lock:
      if index not in self.kept and self.kept_bytes + size <= self.max_bytes:
        for v in out.values():
          if isinstance(v, np.ndarray):
            v.setflags(write=False)
        self.kept[index] = out
        self.kept_bytes += size
    return out


class EpochShuffle(grain.MapDataset):
  """Each epoch of `parent` in its own random order, `numpy.random.default_rng([seed, epoch]).permutation`, kept
  for the epoch; indexed past `len(parent)` (under `repeat(None)`) it reads the next epochs. Grain's `shuffle`
  computes each index by a cycle walk whose length goes as 1 / items (~7 ms an index at 4 items, 0.3 ms at 100),
  paid at every read in the prefetch threads: on a short stage's few items, more than its training
  (docs/results/README.md#test-suite)."""

  def __init__(self, parent: grain.MapDataset, *, seed: int):
    super().__init__(parent)
    self._seed = int(seed)
    self._orders: dict[int, np.ndarray] = {}
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return len(self._parent)

  def _order(self, epoch: int) -> np.ndarray:
    with self._lock:
      if epoch not in self._orders:
        self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}  # prefetch reads ≤ 2 epochs
        self._orders[epoch] = np.random.default_rng([self._seed, epoch]).permutation(len(self._parent))
      return self._orders[epoch]

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    epoch, within = divmod(index, len(self._parent))
    return self._parent[int(self._order(epoch)[within]) + epoch * len(self._parent)]


def il_dataset(items: list[dict], encode: EncodeSample, *, batch_size: int, seed: int = 0,
               shuffle: bool = True, cache_bytes: int = ENCODED_CACHE_BYTES) -> grain.MapDataset:
  """Endless MapDataset of this process's batches (the global `batch_size` split over JAX processes).

  Each epoch is reshuffled (`EpochShuffle`, then `repeat`); batches are disjoint across processes. Samples are
  encoded once and kept (`EncodeOnce`, up to `cache_bytes`).
  """
  n_proc, proc = jax.process_count(), jax.process_index()
  if batch_size % n_proc:
    raise ValueError(f"train.batch_size={batch_size} must divide by the {n_proc} JAX processes")
  if not items:
    raise ValueError("IL dataset is empty; check config.data.path")
  ds = grain.MapDataset.source(range(len(items)))  # indices, so that the shuffled order is the items' own
  if shuffle:
    ds = EpochShuffle(ds, seed=seed)
  ds = ds.repeat(None).map(EncodeOnce(items, encode, cache_bytes)).batch(batch_size // n_proc, drop_remainder=True)
  if n_proc > 1:
    ds = ds[proc::n_proc]
  return ds


def pack_samples(items: list[dict], tokenizer, seq_len: int) -> dict[str, np.ndarray]:
  """Text samples tokenised and packed best-fit into rows of `seq_len` next-token pairs (`data.packing`), a
  sample's `weight` spread over its tokens: the arrays `rows_dataset` batches."""
  samples = [conversation.tokenize(item, tokenizer, 1) for item in items]
  scalars = {"weight": [float(x.get("weight", 1.0)) for x in items]} if any("weight" in x for x in items) else None
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  return packing.pack(samples, seq_len, int(pad), scalars)


def read_options(num_threads: int = 2, prefetch: int = 16) -> grain.ReadOptions:
  return grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)


def rows_dataset(arrays: dict[str, np.ndarray], *, batch_size: int, seed: int = 0) -> grain.MapDataset:
  """Endless MapDataset of this process's batches of rows of `arrays` (equal leading dimensions), shuffled
  every epoch: the data of a model trained on precomputed features (Digi-Q's critic)."""
  n_proc, proc = jax.process_count(), jax.process_index()
  sizes = {k: len(v) for k, v in arrays.items()}
  if len(set(sizes.values())) != 1 or not next(iter(sizes.values()), 0):
    raise ValueError(f"rows_dataset: arrays need one non-zero leading dimension, got {sizes}")
  if batch_size % n_proc:
    raise ValueError(f"train.batch_size={batch_size} must divide by the {n_proc} JAX processes")
  ds = EpochShuffle(grain.MapDataset.source(range(next(iter(sizes.values())))), seed=seed).repeat(None)
  ds = ds.map(lambda i: {k: v[i] for k, v in arrays.items()}).batch(batch_size // n_proc, drop_remainder=True)
  return ds[proc::n_proc] if n_proc > 1 else ds
