"""Qwen2.5-VL's vision tower (`Qwen2_5_VisionTransformerPretrainedModel`) as a Flax NNX module.

Patches come flattened as the Qwen2-VL image processor writes them ([N, 3 * temporal_patch * patch * patch]); a
bias-free linear map (the Conv3d) embeds them; 2-D rotary positions (row, column; laid out block-major over
`spatial_merge_size`^2 blocks) rotate q and k; most blocks attend only within windows of `window_size` pixels,
the `fullatt_block_indexes` blocks within each image; RMS norms and a SwiGLU MLP with biases; the merger
concatenates each 2x2 block of patch features and maps it to the text width. Window and rotary layouts depend
only on the images' grids, so they are computed on the host (`layout`) and the attention is a masked dense one.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent.models import layers


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  depth: int = 32
  hidden_size: int = 1280
  intermediate_size: int = 3420
  num_heads: int = 16
  out_hidden_size: int = 3584
  patch_size: int = 14
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  window_size: int = 112
  fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
  rope_theta: float = 10000.0
  act: str = "silu"

  @classmethod
  def from_hf(cls, hf: dict) -> "VisionConfig":
    rope = hf.get("rope_parameters") or {}
    return cls(depth=hf.get("depth", 32), hidden_size=hf.get("hidden_size", 1280),
               intermediate_size=hf.get("intermediate_size", 3420), num_heads=hf.get("num_heads", 16),
               out_hidden_size=hf.get("out_hidden_size", 3584), patch_size=hf.get("patch_size", 14),
               temporal_patch_size=hf.get("temporal_patch_size", 2),
               spatial_merge_size=hf.get("spatial_merge_size", 2), window_size=hf.get("window_size", 112),
               fullatt_block_indexes=tuple(hf.get("fullatt_block_indexes", (7, 15, 23, 31))),
               rope_theta=float(rope.get("rope_theta", 10000.0)), act=hf.get("hidden_act", "silu"))

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    return 3 * self.temporal_patch_size * self.patch_size ** 2


@dataclasses.dataclass(frozen=True)
class Layout:
  """Host-side arrays for a batch of image grids: the window order of the patches, their rotary positions
  (in that order), and which patches may attend to which, for window and full-attention blocks."""
  window_index: np.ndarray  # [N / merge^2] merged-block order
  positions: np.ndarray  # [N, 2] (row, column) per patch, in window order
  window_segments: np.ndarray  # [N] segment id: patches attend within equal ids (window blocks)
  image_segments: np.ndarray  # [N] segment id for full-attention blocks (one per image frame)


def layout(cfg: VisionConfig, grid_thw) -> Layout:
  """HF's `get_vision_position_ids`, `get_vision_window_index` and cu_seqlens, for grids [(t, h, w), ...]."""
  m = cfg.spatial_merge_size
  unit = m * m
  window = cfg.window_size // m // cfg.patch_size
  positions, index, win_lens, img_lens, offset = [], [], [], [], 0
  for t, h, w in [tuple(int(v) for v in g) for g in grid_thw]:
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    block = (h // m, m, w // m, m)
    pos = np.stack([rows.reshape(block).transpose(0, 2, 1, 3).reshape(-1),
                    cols.reshape(block).transpose(0, 2, 1, 3).reshape(-1)], -1)
    positions.append(np.tile(pos, (t, 1)))
    gh, gw = h // m, w // m
    idx = np.arange(t * gh * gw).reshape(t, gh, gw)
    ph, pw = window - gh % window, window - gw % window
    padded = np.pad(idx, ((0, 0), (0, ph), (0, pw)), constant_values=-100)
    nh, nw = (gh + ph) // window, (gw + pw) // window
    padded = padded.reshape(t, nh, window, nw, window).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, -1)
    win_lens += [int(n) * unit for n in (padded != -100).sum(-1).reshape(-1) if n]
    flat = padded.reshape(-1)
    index.append(flat[flat != -100] + offset)
    offset += t * gh * gw
    img_lens += [h * w] * t
  window_index = np.concatenate(index)
  pos = np.concatenate(positions)
  n = len(pos)
  pos = pos.reshape(n // unit, unit, 2)[window_index].reshape(n, 2)
  return Layout(window_index, pos, np.repeat(np.arange(len(win_lens)), win_lens),
                np.repeat(np.arange(len(img_lens)), img_lens))


def _rotate(x, cos, sin):
  x1, x2 = jnp.split(x, 2, axis=-1)
  return x * cos + jnp.concatenate([-x2, x1], -1) * sin


class Block(nnx.Module):

  def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs):
    e, f = cfg.hidden_size, cfg.intermediate_size
    dense = lambda i, o: layers.Dense(i, o, in_axes=(None,), out_axes=(None,), use_bias=True, rngs=rngs)
    self.norm1, self.norm2 = layers.RMSNorm(e), layers.RMSNorm(e)
    self.qkv, self.proj = dense(e, 3 * e), dense(e, e)
    self.gate_proj, self.up_proj, self.down_proj = dense(e, f), dense(e, f), dense(f, e)
    self.cfg = cfg

  def __call__(self, x, cos, sin, mask):
    cfg = self.cfg
    n = x.shape[0]
    q, k, v = jnp.moveaxis(self.qkv(self.norm1(x)).reshape(n, 3, cfg.num_heads, cfg.head_dim), 1, 0)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    scores = jnp.einsum("qhd,khd->hqk", q, k, preferred_element_type=jnp.float32) * cfg.head_dim ** -0.5
    probs = jax.nn.softmax(jnp.where(mask[None], scores, -1e30), -1).astype(v.dtype)
    x = x + self.proj(jnp.einsum("hqk,khd->qhd", probs, v).reshape(n, -1))
    h = self.norm2(x)
    return x + self.down_proj(jax.nn.silu(self.gate_proj(h)) * self.up_proj(h))


class VisionTower(nnx.Module):
  """Flattened patches [N, patch_dim] + their `Layout` -> merged features [N / merge^2, out_hidden_size]."""

  def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    e, merged = cfg.hidden_size, cfg.hidden_size * cfg.spatial_merge_size ** 2
    shape = (3, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size, e)  # the Conv3d's kernel, channels last
    self.patch_embed = nnx.Param(layers.normal_init(0.02)(rngs.params(), shape, jnp.float32))
    self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.depth)])
    self.ln_q = layers.RMSNorm(e)
    self.mlp_0 = layers.Dense(merged, merged, in_axes=(None,), out_axes=(None,), use_bias=True, rngs=rngs)
    self.mlp_2 = layers.Dense(merged, cfg.out_hidden_size, in_axes=(None,), out_axes=(None,), use_bias=True,
                              rngs=rngs)

  def __call__(self, patches: jax.Array, lay: Layout) -> jax.Array:
    cfg = self.cfg
    unit = cfg.spatial_merge_size ** 2
    kernel = self.patch_embed.get_value()
    n = patches.shape[0]
    x = jnp.einsum("nctpq,ctpqe->ne", patches.astype(jnp.float32).reshape((n,) + kernel.shape[:4]), kernel)
    x = x.reshape(n // unit, unit, -1)[lay.window_index].reshape(n, -1)
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, half, 2, dtype=jnp.float32) / half))
    angles = jnp.asarray(lay.positions, jnp.float32)[..., None] * inv_freq  # [N, 2, D/4]
    angles = jnp.concatenate([angles[:, 0], angles[:, 1]], -1)
    angles = jnp.concatenate([angles, angles], -1)[:, None]  # [N, 1, D]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    win, img = jnp.asarray(lay.window_segments), jnp.asarray(lay.image_segments)
    window_mask, full_mask = win[:, None] == win[None], img[:, None] == img[None]
    for i, block in enumerate(self.blocks):
      x = block(x, cos, sin, full_mask if i in cfg.fullatt_block_indexes else window_mask)
    merged = self.mlp_2(jax.nn.gelu(self.mlp_0(self.ln_q(x).reshape(n // unit, -1)), approximate=False))
    return merged[np.argsort(lay.window_index)]
