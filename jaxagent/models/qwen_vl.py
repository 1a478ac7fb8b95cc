"""Qwen2.5-VL in the recipes at a fixed resolution: image patches, M-RoPE positions, and the forward over batches.

Qwen2-VL reads each image at its own resolution (its own number of patches and tokens). The recipes' data
pipeline, train step and sampler keep fixed shapes, so here every image of a run is resized to one square side:
`config.data.image_size` rounded to the nearest multiple of patch_size × spatial_merge_size (the pixels of one
merged token). An image is then a grid (1, g, g) of patches and `tokens_per_image` = (g / merge)² tokens, and a
batch has the shapes of a fixed-token VLM. Native dynamic resolution is a known limitation: a non-square
screenshot is stretched to the square, and a larger side costs tokens quadratically.

Patches are flattened as transformers' `Qwen2VLImageProcessor` does: bicubic resize, ×1/255, mean/std
normalisation, the frame repeated `temporal_patch_size` times, patches ordered merge-block by merge-block, each
(channel, time, row, column). A sample's `<image>` becomes the checkpoint's `<|vision_start|><|image_pad|>…
<|vision_end|>` through its chat template (`conversation.template_image_token`); its M-RoPE positions [3, T] are
`qwen2_vl.rope_index` of the sample on the host.

In models/ because it is what `models.vit.ImagePreprocessing` is
for LLaVA and idefics2: `models.build` returns it as the model's `preprocess`, below the data that uses it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models import flops, qwen2_vl, vit, vlm

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # Qwen2VLImageProcessor's defaults
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_IMAGE_SIZE = 448  # a HF directory without our policy metadata: 16×16 patches of 28 px, 256 tokens


@dataclasses.dataclass(frozen=True)
class QwenImages:
  """uint8 RGB images → patches [N, g², patch_dim] at a fixed side, and the M-RoPE positions of their tokens.

  Plays the part `models.vit.ImagePreprocessing` plays for LLaVA and idefics2 (`BuiltModel.preprocess`,
  `LoadedModel.preprocess`); `config` is the model's `qwen2_vl.Qwen2VLConfig` (patch sizes, token ids).
  """
  config: Any
  size: int  # pixels per side, a multiple of patch_size × spatial_merge_size
  mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
  std: tuple[float, float, float] = OPENAI_CLIP_STD
  crop_size = None  # `BuiltModel.image_size` reads `crop_size or size`

  def __post_init__(self):
    unit = self.unit(self.config)
    if self.size < unit or self.size % unit:
      raise ValueError(f"QwenImages.size={self.size} must be a positive multiple of {unit} (patch × merge)")

  @staticmethod
  def unit(config) -> int:
    return config.vision.patch_size * config.vision.spatial_merge_size

  @classmethod
  def for_size(cls, config, image_size: int, **kw) -> "QwenImages":
    """`image_size` (`config.data.image_size`) rounded to the nearest multiple of patch × merge (at least one)."""
    unit = cls.unit(config)
    return cls(config, max(unit, round(int(image_size) / unit) * unit), **kw)

  @classmethod
  def from_dir(cls, path: str, config, image_size: int) -> "QwenImages":
    """`for_size` with the mean/std of the checkpoint's `preprocessor_config.json` (CLIP's when it has none)."""
    proc = os.path.join(path, "preprocessor_config.json")
    meta = {}
    if os.path.exists(proc):
      with open(proc, encoding="utf-8") as f:
        meta = json.load(f)
    return cls.for_size(config, image_size, mean=tuple(meta.get("image_mean", OPENAI_CLIP_MEAN)),
                        std=tuple(meta.get("image_std", OPENAI_CLIP_STD)))

  @property
  def grid(self) -> tuple[int, int, int]:
    g = self.size // self.config.vision.patch_size
    return (1, g, g)

  @property
  def tokens_per_image(self) -> int:
    return self.config.tokens_per_image(self.grid)

  @property
  def patch_shape(self) -> tuple[int, int]:
    return (self.grid[1] * self.grid[2], self.config.vision.patch_dim)

  def __call__(self, images: Sequence[Any]) -> np.ndarray:
    """Patches [len(images), g², 3 · temporal · patch²] float32, as `Qwen2VLImageProcessor` flattens them."""
    v = self.config.vision
    pixels = vit.ImagePreprocessing(self.size, None, self.mean, self.std, shortest_edge=False)(images)
    n, p, m, g = len(pixels), v.patch_size, v.spatial_merge_size, self.grid[1]
    x = pixels.transpose(0, 3, 1, 2).reshape(n, 3, g // m, m, p, g // m, m, p)
    x = x.transpose(0, 2, 5, 3, 6, 1, 4, 7)  # [n, rows/m, cols/m, m, m, C, P, P]: merge blocks in order
    x = np.broadcast_to(x[:, :, :, :, :, :, None], x.shape[:6] + (v.temporal_patch_size, p, p))
    return np.ascontiguousarray(x.reshape((n,) + self.patch_shape), np.float32)

  def positions(self, input_ids: np.ndarray, attention_mask: np.ndarray, num_images: int) -> np.ndarray:
    """M-RoPE positions [3, T] int32 of one sample (`qwen2_vl.rope_index`; padding gets 0)."""
    return self.batch_positions(input_ids[None], attention_mask[None], num_images)[:, 0]

  def batch_positions(self, input_ids: np.ndarray, attention_mask: np.ndarray, num_images: int) -> np.ndarray:
    """M-RoPE positions [3, B, T] int32 of a batch whose image tokens belong to `num_images` images, in order."""
    grids = np.asarray([self.grid] * num_images, np.int64).reshape(-1, 3)
    return qwen2_vl.rope_index(self.config, input_ids, grids, attention_mask)[0].astype(np.int32)

  def sample_arrays(self, patches: np.ndarray, input_ids: np.ndarray, attention_mask: np.ndarray,
                    max_images: int) -> dict[str, np.ndarray]:
    """A training sample's image fields: `patches` [max_images, g², D] (its images first, zeros after),
    `image_mask` [max_images] and `positions` [3, T]."""
    n = len(patches)
    slots = np.zeros((max_images,) + self.patch_shape, np.float32)
    slots[:n] = patches
    return {"patches": slots, "image_mask": np.arange(max_images) < n,
            "positions": self.positions(input_ids, attention_mask, n)}


def image_features(model, patches: jax.Array) -> jax.Array:
  """Merged features [I · tokens_per_image, E] of images [I, g², D] that share one square grid: the tower runs
  image by image (`vmap`), so attention costs I · g⁴, not (I · g²)²."""
  side = math.isqrt(patches.shape[1])
  if side * side != patches.shape[1]:
    raise ValueError(f"qwen_vl.image_features: {patches.shape[1]} patches per image is not a square grid")
  lay = qwen2_vl.layout(model.config.vision, [(1, side, side)])
  feats = jax.vmap(lambda x: model.visual(x, lay))(patches)
  return feats.reshape(-1, feats.shape[-1])


def embed(model, input_ids: jax.Array, patches: jax.Array) -> jax.Array:
  """Token embeddings [B, T, E] with the n-th image's features over the n-th image-token block (row-major);
  images past the last block (padding slots) are ignored."""
  embeds = model.decoder.embed(input_ids)
  return vlm.merge_image_features(embeds, input_ids, image_features(model, patches), model.config.image_token_id)


def batch_logits(model, batch: dict) -> jax.Array:
  """Logits [B, T, V] of a training batch of `EncodeSample` for Qwen2.5-VL: `patches` [B, M, g², D] slots (the
  real ones flagged by `image_mask`), `positions` [B, 3, T] M-RoPE positions."""
  merged = embed(model, batch["input_ids"], vlm.flat_images(batch["patches"], batch["image_mask"]))
  hidden, _ = model.hidden_states(inputs_embeds=merged, positions=jnp.moveaxis(batch["positions"], 1, 0),
                                  attention_mask=batch["attention_mask"])
  return model.logits(hidden)


def flops_per_token(config, images: QwenImages, seq_len: int, max_images: int) -> float:
  """Training FLOPs per text token: the decoder's, plus `max_images` tower passes per sample (window blocks
  counted as full attention over the image, an upper bound)."""
  v, n = config.vision, images.patch_shape[0]
  e, merged = v.hidden_size, v.hidden_size * v.spatial_merge_size ** 2
  per_patch = v.patch_dim * e + v.depth * (4 * e * e + 3 * e * v.intermediate_size + 2 * n * e)
  per_patch += (merged * merged + merged * v.out_hidden_size) / v.spatial_merge_size ** 2
  tower = 6.0 * n * per_patch
  return flops.decoder_flops_per_token(config.text, seq_len) + max_images / seq_len * tower


def is_qwen(policy) -> bool:
  """Whether a `LoadedModel` (or `BuiltModel`) is a Qwen2.5-VL one (its images are `QwenImages`)."""
  return isinstance(getattr(policy, "preprocess", None), QwenImages)
