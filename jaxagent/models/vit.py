"""ViT vision towers (CLIP and SigLIP) as Flax NNX modules, plus the matching numpy image preprocessing.

One `VisionTower` covers both families; `ViTConfig.family` fixes the few places where they differ:

| | CLIP (`CLIPVisionModel`) | SigLIP (`SiglipVisionModel`) |
|---|---|---|
| class token | yes | no |
| norm before the encoder | `pre_layrnorm` | none |
| activation | quick-GELU | tanh-approximated GELU |
| patch conv bias | no | yes |
| `post_layernorm` on | the pooled class token only | every token (`last_hidden_state`) |
| pooled output | class token | optional attention-pooling (MAP) head |

`select_layer` indexes the list of hidden states exactly as Hugging Face's `hidden_states` does (entry 0 is the
embeddings, entry i the output of block i), so LLaVA's `vision_feature_layer=-2` means "the output of the
second-to-last block"; the tower then runs only the blocks it needs. `None` selects `last_hidden_state`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import sharding
from jaxagent.models import layers

FAMILIES = ("clip", "siglip")
SELECT_FEATURES = ("patch", "cls_patch")


def quick_gelu(x):
  """CLIP's GELU approximation `x * sigmoid(1.702 x)` (HF `quick_gelu`)."""
  return x * jax.nn.sigmoid(1.702 * x)


ACTIVATIONS = {
    "quick_gelu": quick_gelu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


@dataclasses.dataclass(frozen=True)
class ViTConfig:
  """A ViT image encoder; build with `ViTConfig.clip(...)`, `.siglip(...)` or `.tiny()`."""
  family: str = "clip"
  image_size: int = 224
  patch_size: int = 16
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  act: str = "quick_gelu"
  norm_eps: float = 1e-5
  select_layer: int | None = None
  select_feature: str = "patch"
  pool_head: bool = False
  position_grid: int = 0  # idefics2 (NaViT): a fixed grid of positions this many a side; 0: one per patch
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str | bool = "none"  # what each block's backward keeps: `layers.REMAT_POLICIES`

  def __post_init__(self):
    def bad(field, why):
      raise ValueError(f"ViTConfig.{field}: {why}")
    if self.family not in FAMILIES:
      bad("family", f"{self.family!r} is not one of {FAMILIES}")
    if self.image_size % self.patch_size:
      bad("image_size", f"{self.image_size} is not a multiple of patch_size={self.patch_size}")
    if self.width % self.num_heads:
      bad("num_heads", f"{self.num_heads} does not divide width={self.width}")
    if self.act not in ACTIVATIONS:
      bad("act", f"{self.act!r} is not one of {sorted(ACTIVATIONS)}")
    if self.select_feature not in SELECT_FEATURES:
      bad("select_feature", f"{self.select_feature!r} is not one of {SELECT_FEATURES}")
    if self.select_feature == "cls_patch" and not self.class_token:
      bad("select_feature", "'cls_patch' needs a class token, which SigLIP has not; use 'patch'")
    if self.select_layer is not None and not -(self.depth + 1) <= self.select_layer <= self.depth:
      bad("select_layer", f"{self.select_layer} is outside [-{self.depth + 1}, {self.depth}] for depth={self.depth}")
    if self.pool_head and self.family != "siglip":
      bad("pool_head", "only SigLIP has an attention-pooling head; CLIP pools its class token")
    if self.position_grid and (self.family != "siglip" or self.position_grid < self.grid):
      bad("position_grid", f"{self.position_grid}: bucketed positions are idefics2's SigLIP tower's and need a "
          f"grid at least the image's ({self.grid} patches a side); use 0 for one position per patch")

  @classmethod
  def clip(cls, **kw) -> "ViTConfig":
    return cls(**{"family": "clip", "act": "quick_gelu", "norm_eps": 1e-5, **kw})

  @classmethod
  def siglip(cls, **kw) -> "ViTConfig":
    return cls(**{"family": "siglip", "act": "gelu_pytorch_tanh", "norm_eps": 1e-6, **kw})

  @classmethod
  def tiny(cls, family: str = "clip", **kw) -> "ViTConfig":
    """64x64 images, 16 patches of 16x16, 2 blocks of width 64: trains on a laptop CPU in seconds a step."""
    base = dict(image_size=64, patch_size=16, width=64, depth=2, num_heads=4, mlp_dim=128)
    make = cls.clip if family == "clip" else cls.siglip
    return make(**{**base, **kw})

  @property
  def class_token(self) -> bool:
    return self.family == "clip"

  @property
  def grid(self) -> int:
    return self.image_size // self.patch_size

  @property
  def num_patches(self) -> int:
    return self.grid ** 2

  @property
  def num_positions(self) -> int:
    if self.position_grid:
      return self.position_grid ** 2
    return self.num_patches + int(self.class_token)

  def position_ids(self) -> np.ndarray | None:
    """idefics2's patch positions: the image's `grid` x `grid` patches spread over the `position_grid` table.

    HF (`Idefics2VisionEmbeddings`) buckets the fractions i/grid against boundaries made by `torch.arange`,
    whose float rounding moves some patches one bucket down (54 of the 2485 (table, grid) pairs up to 70);
    these are the exact buckets floor(i * position_grid / grid), equal to HF's at the full grid (arange).
    """
    if not self.position_grid:
      return None
    rows = (np.arange(self.grid) * self.position_grid) // self.grid
    return (rows[:, None] * self.position_grid + rows[None, :]).reshape(-1)

  @property
  def num_features(self) -> int:
    """Tokens per image that `VisionTower.__call__` returns (what a VLM writes into the text)."""
    return self.num_patches + int(self.select_feature == "cls_patch")

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads

  def blocks_needed(self) -> int:
    """How many blocks to run to reach `select_layer` (all of them for `last_hidden_state`)."""
    if self.select_layer is None:
      return self.depth
    return self.select_layer % (self.depth + 1)


def _param(rngs: nnx.Rngs, init, shape, axes, dtype) -> nnx.Param:
  return nnx.Param(init(rngs.params(), shape, jnp.dtype(dtype)), logical_axes=axes)


def _layer_norm(cfg: ViTConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
  # use_fast_variance=False: E[(x-mean)^2] like PyTorch, for 1e-4 parity on large activations.
  return nnx.LayerNorm(cfg.width, epsilon=cfg.norm_eps, dtype=jnp.dtype(cfg.dtype),
                       param_dtype=jnp.dtype(cfg.param_dtype), use_fast_variance=False,
                       scale_metadata={"logical_axes": ("norm",)},
                       bias_metadata={"logical_axes": ("norm",)}, rngs=rngs)


def _dense(cfg: ViTConfig, din, dout, in_axes, out_axes, rngs: nnx.Rngs) -> layers.Dense:
  return layers.Dense(din, dout, in_axes=in_axes, out_axes=out_axes, use_bias=True, dtype=jnp.dtype(cfg.dtype),
                      param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs)


class PatchEmbed(nnx.Module):
  """A stride-`patch` convolution written as one einsum over non-overlapping patches (kernel in HWIO)."""

  def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
    p, dt = cfg.patch_size, cfg.param_dtype
    self.patch_size = p
    self.dtype = jnp.dtype(cfg.dtype)
    self.kernel = _param(rngs, nnx.initializers.lecun_normal(), (p, p, 3, cfg.width),
                         ("patch", "patch", None, "vision_embed"), dt)
    self.bias = (_param(rngs, nnx.initializers.zeros, (cfg.width,), ("vision_embed",), dt)
                 if cfg.family == "siglip" else None)

  def __call__(self, images: jax.Array) -> jax.Array:
    n, h, w, c = images.shape
    p = self.patch_size
    x = images.astype(self.dtype).reshape(n, h // p, p, w // p, p, c)
    x = jnp.einsum("nhpwqc,pqce->nhwe", x, self.kernel.get_value().astype(self.dtype))
    if self.bias is not None:
      x = x + self.bias.get_value().astype(self.dtype)
    return x.reshape(n, (h // p) * (w // p), -1)


class Attention(nnx.Module):
  """Bidirectional multi-head attention; heads are their own kernel axis so `vision_heads` can shard them."""

  def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
    e, n, d = cfg.width, cfg.num_heads, cfg.head_dim
    self.scale = d ** -0.5
    heads = ("vision_heads", "head_dim")
    self.q = _dense(cfg, e, (n, d), ("vision_embed",), heads, rngs)
    self.k = _dense(cfg, e, (n, d), ("vision_embed",), heads, rngs)
    self.v = _dense(cfg, e, (n, d), ("vision_embed",), heads, rngs)
    self.out = _dense(cfg, (n, d), e, heads, ("vision_embed",), rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    q, k, v = self.q(x), self.k(x), self.v(x)
    q = sharding.shard(q, ("batch", "length", "act_heads", None))
    o = jax.nn.dot_product_attention(q, k, v, scale=self.scale)
    return self.out(o)


class Mlp(nnx.Module):

  def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
    self.fc1 = _dense(cfg, cfg.width, cfg.mlp_dim, ("vision_embed",), ("vision_mlp",), rngs)
    self.fc2 = _dense(cfg, cfg.mlp_dim, cfg.width, ("vision_mlp",), ("vision_embed",), rngs)
    self.act = ACTIVATIONS[cfg.act]

  def __call__(self, x: jax.Array) -> jax.Array:
    h = self.act(self.fc1(x))
    h = sharding.shard(h, ("batch", "length", "act_mlp"))
    return self.fc2(h)


class Block(nnx.Module):
  """Pre-norm transformer block (CLIP and SigLIP share it)."""

  def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
    self.norm1 = _layer_norm(cfg, rngs)
    self.attn = Attention(cfg, rngs)
    self.norm2 = _layer_norm(cfg, rngs)
    self.mlp = Mlp(cfg, rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x + self.attn(self.norm1(x))
    x = x + self.mlp(self.norm2(x))
    return sharding.shard(x, ("batch", "length", "act_embed"))


class PoolAttention(nnx.Module):
  """Cross-attention from a probe to the tokens, with q/k/v fused in one projection as `nn.MultiheadAttention`
  stores them (`in_proj` [embed, 3, heads, head_dim])."""

  def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
    e, n, d = cfg.width, cfg.num_heads, cfg.head_dim
    self.scale = d ** -0.5
    heads = ("vision_heads", "head_dim")
    self.in_proj = _dense(cfg, e, (3, n, d), ("vision_embed",), (None,) + heads, rngs)
    self.out = _dense(cfg, (n, d), e, heads, ("vision_embed",), rngs)

  def __call__(self, probe: jax.Array, x: jax.Array) -> jax.Array:
    q = self.in_proj(probe)[:, :, 0]
    kv = self.in_proj(x)
    o = jax.nn.dot_product_attention(q, kv[:, :, 1], kv[:, :, 2], scale=self.scale)
    return self.out(o)


class MapHead(nnx.Module):
  """SigLIP's multi-head attention pooling: one learned probe attends over all tokens, then a residual MLP."""

  def __init__(self, cfg: ViTConfig, rngs: nnx.Rngs):
    self.probe = _param(rngs, nnx.initializers.normal(1.0), (1, 1, cfg.width), (None, None, "vision_embed"),
                        cfg.param_dtype)
    self.attn = PoolAttention(cfg, rngs)
    self.norm = _layer_norm(cfg, rngs)
    self.mlp = Mlp(cfg, rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    probe = jnp.broadcast_to(self.probe.get_value().astype(x.dtype), (x.shape[0], 1, x.shape[-1]))
    h = self.attn(probe, x)
    h = h + self.mlp(self.norm(h))
    return h[:, 0]


@dataclasses.dataclass
class VisionOutput:
  """Everything a tower computes; `hidden_states` is filled only when asked (as HF's `output_hidden_states`)."""
  last_hidden_state: jax.Array
  pooled: jax.Array | None
  hidden_states: tuple[jax.Array, ...] | None = None


jax.tree_util.register_dataclass(VisionOutput, data_fields=["last_hidden_state", "pooled", "hidden_states"],
                                 meta_fields=[])


class VisionTower(nnx.Module):
  """Images [N, H, W, 3] (already normalised, see `ImagePreprocessing`) -> per-token features."""

  def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    dt = cfg.param_dtype
    self.patch_embed = PatchEmbed(cfg, rngs)
    self.cls_token = (_param(rngs, nnx.initializers.normal(cfg.width ** -0.5), (cfg.width,), ("vision_embed",), dt)
                      if cfg.class_token else None)
    self.pos_embed = _param(rngs, nnx.initializers.normal(0.02), (cfg.num_positions, cfg.width),
                            ("patch", "vision_embed"), dt)
    self.pre_norm = _layer_norm(cfg, rngs) if cfg.family == "clip" else None
    self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.depth)])
    self.post_norm = _layer_norm(cfg, rngs)
    self.head = MapHead(cfg, rngs) if cfg.pool_head else None

  def embed(self, images: jax.Array) -> jax.Array:
    cfg = self.cfg
    if images.ndim != 4 or images.shape[1:] != (cfg.image_size, cfg.image_size, 3):
      raise ValueError(f"VisionTower: images must be [N, {cfg.image_size}, {cfg.image_size}, 3] (NHWC, normalised; "
                       f"see ImagePreprocessing), got {tuple(images.shape)}")
    x = self.patch_embed(images)
    if self.cls_token is not None:
      cls = jnp.broadcast_to(self.cls_token.get_value().astype(x.dtype), (x.shape[0], 1, x.shape[-1]))
      x = jnp.concatenate([cls, x], axis=1)
    pos = self.pos_embed.get_value().astype(x.dtype)
    ids = cfg.position_ids()
    x = x + (pos if ids is None else jnp.take(pos, jnp.asarray(ids), axis=0))
    if self.pre_norm is not None:
      x = self.pre_norm(x)
    return sharding.shard(x, ("batch", "length", "act_embed"))

  def _run_block(self, block: Block, x: jax.Array) -> jax.Array:
    return layers.remat(lambda b, h: b(h), self.cfg.remat)(block, x)

  def encode(self, images: jax.Array, *, num_blocks: int | None = None,
             return_hidden_states: bool = False) -> VisionOutput:
    """Run the first `num_blocks` blocks (all by default); the finishing norms/head only after the last one."""
    cfg = self.cfg
    num_blocks = cfg.depth if num_blocks is None else num_blocks
    x = self.embed(images)
    hidden = [x]
    for block in list(self.blocks)[:num_blocks]:
      x = self._run_block(block, x)
      hidden.append(x)
    pooled = None
    if num_blocks == cfg.depth:
      if cfg.family == "siglip":
        x = self.post_norm(x)
        pooled = self.head(x) if self.head is not None else None
      else:
        pooled = self.post_norm(x[:, 0])
    return VisionOutput(x, pooled, tuple(hidden) if return_hidden_states else None)

  def __call__(self, images: jax.Array) -> jax.Array:
    """Features at `select_layer` / `select_feature`: [N, cfg.num_features, width]; what the VLM projects."""
    cfg = self.cfg
    out = self.encode(images, num_blocks=cfg.blocks_needed())
    feats = out.last_hidden_state
    if cfg.class_token and cfg.select_feature == "patch":
      feats = feats[:, 1:]
    return feats


# ---------------------------------------------------------------------------------------------------------------
# Image preprocessing (numpy + PIL), matching the Hugging Face PIL image processors step for step.

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)


@dataclasses.dataclass(frozen=True)
class ImagePreprocessing:
  """uint8 RGB images of any size -> float32 [N, S, S, 3] normalised, as the tower expects.

  CLIP (`CLIPImageProcessor`): bicubic resize of the shortest edge to `size`, centre crop `crop_size`.
  SigLIP (`SiglipImageProcessor`): bicubic resize to `size` x `size`, no crop. Both then scale by 1/255 and
  normalise with `mean`/`std`. `pad_to_square` first pads to a square with the mean colour, as LLaVA-1.5's
  `image_aspect_ratio="pad"` (`expand2square`) does, so no part of a screenshot is cropped away.
  """
  size: int
  crop_size: int | None = None
  mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
  std: tuple[float, float, float] = OPENAI_CLIP_STD
  shortest_edge: bool = True
  pad_to_square: bool = False

  @classmethod
  def clip(cls, image_size: int, **kw) -> "ImagePreprocessing":
    return cls(**{"size": image_size, "crop_size": image_size, "shortest_edge": True, **kw})

  @classmethod
  def siglip(cls, image_size: int, **kw) -> "ImagePreprocessing":
    return cls(**{"size": image_size, "crop_size": None, "mean": SIGLIP_MEAN, "std": SIGLIP_STD,
                  "shortest_edge": False, **kw})

  @classmethod
  def for_tower(cls, cfg: ViTConfig, **kw) -> "ImagePreprocessing":
    return (cls.clip if cfg.family == "clip" else cls.siglip)(cfg.image_size, **kw)

  def _one(self, image) -> np.ndarray:
    from PIL import Image  # pylint: disable=g-import-not-at-top
    if not isinstance(image, Image.Image):
      arr = np.asarray(image)
      if arr.ndim != 3 or arr.shape[-1] not in (3, 4) or arr.dtype != np.uint8:
        raise ValueError(f"ImagePreprocessing: expected a uint8 [H, W, 3] RGB array or a PIL image, got "
                         f"{arr.dtype} {arr.shape}")
      image = Image.fromarray(arr)
    image = image.convert("RGB")
    if self.pad_to_square and image.width != image.height:
      side = max(image.width, image.height)
      fill = tuple(int(m * 255) for m in self.mean)
      square = Image.new("RGB", (side, side), fill)
      square.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
      image = square
    if self.shortest_edge:
      w, h = image.width, image.height
      short, long = min(w, h), max(w, h)
      new_long = int(self.size * long / short)
      target = (self.size, new_long) if w <= h else (new_long, self.size)  # PIL wants (width, height)
    else:
      target = (self.size, self.size)
    image = image.resize(target, resample=Image.Resampling.BICUBIC)
    arr = np.asarray(image)
    if self.crop_size is not None:
      arr = _center_crop(arr, self.crop_size)
    arr = arr.astype(np.float64) * (1 / 255)
    arr = ((arr - np.asarray(self.mean)) / np.asarray(self.std)).astype(np.float32)
    return arr

  def __call__(self, images: Sequence[Any]) -> np.ndarray:
    if not len(images):
      side = self.crop_size or self.size
      return np.zeros((0, side, side, 3), np.float32)
    return np.stack([self._one(im) for im in images])


def _center_crop(arr: np.ndarray, size: int) -> np.ndarray:
  """HF `center_crop`: floor offsets; zero-pad (centred, ceil) when the image is smaller than the crop."""
  h, w = arr.shape[:2]
  if h < size or w < size:
    nh, nw = max(h, size), max(w, size)
    padded = np.zeros((nh, nw) + arr.shape[2:], arr.dtype)
    top, left = math.ceil((nh - h) / 2), math.ceil((nw - w) / 2)
    padded[top:top + h, left:left + w] = arr
    arr, h, w = padded, nh, nw
  top, left = (h - size) // 2, (w - size) // 2
  return arr[top:top + size, left:left + size]
