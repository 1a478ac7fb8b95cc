"""Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`): its vision tower and M-RoPE text decoder as Flax NNX modules.

Vision tower (`Qwen2_5_VisionTransformerPretrainedModel`):

Patches come flattened as the Qwen2-VL image processor writes them ([N, 3 * temporal_patch * patch * patch]); a
bias-free linear map (the Conv3d) embeds them; 2-D rotary positions (row, column; laid out block-major over
`spatial_merge_size`^2 blocks) rotate q and k; most blocks attend only within windows of `window_size` pixels,
the `fullatt_block_indexes` blocks within each image; RMS norms and a SwiGLU MLP with biases; the merger
concatenates each 2x2 block of patch features and maps it to the text width. Window and rotary layouts depend
only on the images' grids, so they are computed on the host (`layout`) and the attention is a masked dense one.

Text side: the Llama-family decoder (`llama.Decoder`, Qwen2 flavour: q/k/v biases) with multimodal RoPE. Positions
are [3, B, T] (temporal, row, column); `mrope_section` says how many of the head_dim/2 rotary frequencies take
each of the three (HF `Qwen2_5_VLRotaryEmbedding`). Text tokens have three equal positions; an image's tokens get
(start, start + row, start + column) and the text after it continues from the largest position + 1
(`rope_index`, HF `get_rope_index`, on the host since it depends on where the image tokens are). The decoder's
parameters and pieces are reused as they are; only the rotary step differs, so `Qwen2VL` runs the blocks itself
(`_block`) with cos/sin computed from the 3-D positions, leaving `llama.Decoder` unchanged.

The KV cache is `llama.KVCache`; its `positions` hold each slot's largest M-RoPE position, so that a decode step
without explicit positions continues at (largest valid position + 1), which is HF's `rope_deltas` arithmetic.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import sharding
from jaxagent.models import layers, llama, vlm


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

  def __post_init__(self):
    if self.act not in ACTS:
      raise NotImplementedError(f"vision_config.hidden_act={self.act!r}; supported: {sorted(ACTS)}")

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


# HF ACT2FN names a vision config may give its MLP (`hidden_act`).
ACTS = {"silu": jax.nn.silu, "gelu": lambda x: jax.nn.gelu(x, approximate=False),
        "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
        "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x)}


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
    return x + self.down_proj(ACTS[cfg.act](self.gate_proj(h)) * self.up_proj(h))


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


# ----------------------------------------------------------------------------------------------------
# The whole model: vision tower + M-RoPE decoder


@dataclasses.dataclass(frozen=True)
class Qwen2VLConfig:
  """A Qwen2.5-VL: the vision tower, the Qwen2 decoder, the M-RoPE split and the special token ids."""
  vision: VisionConfig
  text: llama.DecoderConfig
  mrope_section: tuple[int, ...] = (16, 24, 24)  # rotary frequencies per (temporal, row, column); sums to D/2
  image_token_id: int = 151655
  video_token_id: int = 151656
  vision_start_token_id: int = 151652
  vision_end_token_id: int = 151653

  def __post_init__(self):
    if sum(self.mrope_section) != self.text.head_dim // 2:
      raise ValueError(f"Qwen2VLConfig.mrope_section={self.mrope_section} must sum to head_dim/2 = "
                       f"{self.text.head_dim // 2}")
    if self.vision.out_hidden_size != self.text.hidden_size:
      raise ValueError(f"vision out_hidden_size={self.vision.out_hidden_size} != text hidden_size="
                       f"{self.text.hidden_size}")
    if self.text.sliding_window is not None:
      raise NotImplementedError("Qwen2.5-VL with a sliding window (use_sliding_window) is not supported")
    if not 0 <= self.image_token_id < self.text.vocab_size:
      raise ValueError(f"Qwen2VLConfig.image_token_id={self.image_token_id} is outside the vocabulary "
                       f"[0, {self.text.vocab_size})")

  def tokens_per_image(self, grid) -> int:
    """Image tokens one image of grid (t, h, w) takes in the text: its merged patches."""
    t, h, w = (int(v) for v in grid)
    return t * h * w // self.vision.spatial_merge_size ** 2


def rope_index(cfg: Qwen2VLConfig, input_ids, grid_thw=None, attention_mask=None) -> tuple[np.ndarray, np.ndarray]:
  """HF `get_rope_index` for images, on the host: M-RoPE positions [3, B, T] and `rope_deltas` [B].

  Text tokens count up by one on all three axes; the k-th image (row-major through the batch) takes the next
  `tokens_per_image` image tokens, with positions (s, s + row, s + column) on its merged grid from the running
  start s, after which text resumes at s + max(rows, columns). Padding (`attention_mask` 0) gets position 0 and
  is skipped. `rope_deltas` = largest position + 1 - real tokens: the offset of later (generated) tokens.
  """
  ids = np.asarray(input_ids)
  b, t = ids.shape
  mask = np.ones((b, t), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
  grids = [tuple(int(v) for v in g) for g in (np.asarray(grid_thw).reshape(-1, 3) if grid_thw is not None else [])]
  m = cfg.vision.spatial_merge_size
  out = np.zeros((3, b, t), np.int64)
  deltas = np.zeros((b,), np.int64)
  image = 0
  for row in range(b):
    cols = np.nonzero(mask[row])[0]
    tokens = ids[row, cols]
    pos = np.zeros((3, len(cols)), np.int64)
    i, current = 0, 0
    while i < len(tokens):
      if tokens[i] != cfg.image_token_id:
        pos[:, i] = current
        i, current = i + 1, current + 1
        continue
      if image >= len(grids):
        raise ValueError(f"rope_index: more image tokens than the {len(grids)} images of grid_thw")
      gt, gh, gw = grids[image][0], grids[image][1] // m, grids[image][2] // m
      n = gt * gh * gw
      if i + n > len(tokens) or np.any(tokens[i:i + n] != cfg.image_token_id):
        raise ValueError(f"rope_index: image {image} of grid {grids[image]} needs {n} consecutive image tokens "
                         f"(id {cfg.image_token_id}) in row {row}")
      tt, hh, ww = np.meshgrid(np.arange(gt), np.arange(gh), np.arange(gw), indexing="ij")
      pos[:, i:i + n] = np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + current
      i, current, image = i + n, current + max(gh, gw), image + 1
    out[:, row, cols] = pos
    deltas[row] = (pos.max() + 1 if len(cols) else 0) - len(cols)
  return out, deltas


def mrope_cos_sin(positions: jax.Array, head_dim: int, theta: float, section, dtype) -> tuple[jax.Array, jax.Array]:
  """cos, sin [B, T, 1, head_dim] for M-RoPE positions [3, B, T]: frequency j rotates by the position of the axis
  its `section` chunk names (chunk i -> axis i % 3), halves concatenated as HF's rotate_half expects."""
  inv_freq = layers.rope_inv_freq(head_dim, theta)
  axis = np.repeat(np.arange(len(section)) % 3, section)
  angles = jnp.moveaxis(positions.astype(jnp.float32)[axis], 0, -1) * inv_freq  # [B, T, D/2]
  angles = jnp.concatenate([angles, angles], -1)[:, :, None]
  return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def _block(block: llama.Block, x, cos, sin, mask, kv=None, index=None):
  """`llama.Block.__call__` with the rotary step done by precomputed M-RoPE cos/sin (the only difference)."""
  attn = block.self_attn
  h = block.input_layernorm(x)
  q = layers.shard_heads(_rotate(attn.q_proj(h), cos, sin))
  k = layers.shard_heads(_rotate(attn.k_proj(h), cos, sin), kv=True)
  v = layers.shard_heads(attn.v_proj(h), kv=True)
  if kv is not None:
    k = llama.write_slots(kv[0], k.astype(kv[0].dtype), index)
    v = llama.write_slots(kv[1], v.astype(kv[1].dtype), index)
    kv = (k, v)
  out = layers.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask)
  x = x + attn.o_proj(layers.shard_heads(out))
  x = x + block.mlp(block.post_attention_layernorm(x))
  return sharding.shard(x, ("batch", "length", "act_embed")), kv


class Qwen2VL(nnx.Module):
  """Qwen2.5-VL. `__call__(input_ids, pixel_values, grid_thw)` returns float32 logits [B, T, V].

  pixel_values: [num_patches, patch_dim] as the Qwen2-VL image processor flattens them, all images of the batch
  in order of appearance; grid_thw: host ints [num_images, 3]. The k-th image's merged features replace the k-th
  run of `tokens_per_image` image tokens (row-major through the batch, as HF's masked_scatter).
  """

  def __init__(self, cfg: Qwen2VLConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    self.visual = VisionTower(cfg.vision, rngs=rngs)
    self.decoder = llama.Decoder(cfg.text, rngs=rngs)

  def image_features(self, pixel_values: jax.Array, grid_thw) -> jax.Array:
    """Merged patch features [sum of tokens_per_image, text width], images in order."""
    return self.visual(jnp.asarray(pixel_values), layout(self.config.vision, np.asarray(grid_thw).reshape(-1, 3)))

  def embed(self, input_ids: jax.Array, pixel_values=None, grid_thw=None) -> jax.Array:
    """Token embeddings with image features written over the image tokens (`vlm.merge_image_features`)."""
    embeds = self.decoder.embed(input_ids)
    if pixel_values is None:
      return embeds
    feats = self.image_features(pixel_values, grid_thw).astype(embeds.dtype)
    if not isinstance(input_ids, jax.core.Tracer):
      n = int(np.sum(np.asarray(input_ids) == self.config.image_token_id))
      if n != feats.shape[0]:
        raise ValueError(f"Qwen2VL: {n} image tokens but the images of grid_thw give {feats.shape[0]} features")
    merged = vlm.merge_image_features(embeds, input_ids, feats, self.config.image_token_id)
    return sharding.shard(merged, ("batch", "length", "act_embed"))

  def init_cache(self, batch: int, max_len: int, dtype=None) -> llama.KVCache:
    return self.decoder.init_cache(batch, max_len, dtype)

  def hidden_states(self, input_ids=None, *, inputs_embeds=None, positions=None, attention_mask=None,
                    cache: llama.KVCache | None = None):
    """Final-norm hidden states [B, T, E] and the updated cache (None without one).

    positions: [3, B, T] M-RoPE positions ([B, T] is taken as text: the same on all axes). Without them, a
    forward without cache counts 0, 1, ... over the real tokens (text only; pass `rope_index` for images), and
    one with a cache continues from the largest position it holds + 1.
    """
    cfg, dec = self.config, self.decoder
    if (input_ids is None) == (inputs_embeds is None):
      raise ValueError("Qwen2VL: pass exactly one of input_ids or inputs_embeds")
    x = dec.embed(input_ids) if inputs_embeds is None else sharding.shard(
        inputs_embeds.astype(llama.as_dtype(cfg.text.dtype)), ("batch", "length", "act_embed"))
    b, t = x.shape[:2]
    mask = jnp.ones((b, t), bool) if attention_mask is None else jnp.asarray(attention_mask).astype(bool)
    if positions is None:
      start = 0 if cache is None else jnp.max(jnp.where(cache.valid, cache.positions, -1), axis=1)[:, None] + 1
      positions = start + jnp.cumsum(mask, axis=1, dtype=jnp.int32) - mask.astype(jnp.int32)
    positions = jnp.asarray(positions, jnp.int32)
    if positions.ndim == 2:
      positions = jnp.broadcast_to(positions, (3, b, t))
    cos, sin = mrope_cos_sin(positions, cfg.text.head_dim, cfg.text.rope_theta, cfg.mrope_section, x.dtype)
    q_slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if cache is None:
      attn_mask, index = layers.attention_mask(q_slots, q_slots, mask), None
    else:
      index = cache.index
      if jnp.ndim(index) and t != 1:
        raise ValueError(f"a per-row cache index writes one token per row; got {t}")
      valid = llama.write_slots(cache.valid, mask, index)
      k_pos = llama.write_slots(cache.positions, jnp.max(positions, axis=0), index)
      k_slots = jnp.broadcast_to(jnp.arange(cache.max_len, dtype=jnp.int32), valid.shape)
      attn_mask = layers.attention_mask(q_slots + (index[:, None] if jnp.ndim(index) else index), k_slots, valid)
    new_k, new_v = [], []
    for i, block in enumerate(dec.layers):
      kv = None if cache is None else (cache.k[i], cache.v[i])
      if layers.remat_name(cfg.text.remat) != "none" and cache is None:
        x, _ = layers.remat(lambda blk, h, c, s: _block(blk, h, c, s, attn_mask), cfg.text.remat)(block, x, cos, sin)
      else:
        x, kv = _block(block, x, cos, sin, attn_mask, kv, index)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])
    hidden = dec.norm(x)
    if cache is not None:
      cache = llama.KVCache(k=tuple(new_k), v=tuple(new_v), valid=valid, positions=k_pos, index=index + t)
    return hidden, cache

  def logits(self, hidden: jax.Array) -> jax.Array:
    return self.decoder.logits(hidden)

  def __call__(self, input_ids, pixel_values=None, grid_thw=None, *, positions=None, attention_mask=None,
               cache: llama.KVCache | None = None, return_hidden: bool = False):
    """Logits [B, T, V] (then hidden, then the cache, as `llama.Decoder`). Without `positions`, they come from
    `rope_index` on the host, so `input_ids` must then be concrete (outside jit)."""
    if positions is None and cache is None and grid_thw is not None:
      positions = jnp.asarray(rope_index(self.config, input_ids, grid_thw, attention_mask)[0], jnp.int32)
    hidden, new_cache = self.hidden_states(inputs_embeds=self.embed(input_ids, pixel_values, grid_thw),
                                           positions=positions, attention_mask=attention_mask, cache=cache)
    out = (self.logits(hidden),) + ((hidden,) if return_hidden else ()) + ((new_cache,) if cache is not None else ())
    return out[0] if len(out) == 1 else out


_prefill = nnx.jit(lambda model, embeds, positions, mask, cache: model.hidden_states(
    inputs_embeds=embeds, positions=positions, attention_mask=mask, cache=cache))
_step = nnx.jit(lambda model, ids, cache: model.hidden_states(ids, cache=cache))


def greedy_generate(model: Qwen2VL, input_ids, pixel_values=None, grid_thw=None, max_new_tokens: int = 16,
                    attention_mask=None) -> np.ndarray:
  """Greedy decoding with the KV cache: the prompt (with its images and M-RoPE positions) in one pass, then one
  token per step at the next text position. Returns the new tokens [B, max_new_tokens] (no EOS handling)."""
  ids = np.asarray(input_ids)
  b, t = ids.shape
  mask = np.ones((b, t), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
  positions, _ = rope_index(model.config, ids, grid_thw, mask)
  embeds = model.embed(jnp.asarray(ids), pixel_values, grid_thw)
  cache = model.init_cache(b, t + max_new_tokens)
  hidden, cache = _prefill(model, embeds, jnp.asarray(positions, jnp.int32), jnp.asarray(mask), cache)
  last = t - 1 - np.argmax(mask[:, ::-1], axis=1)  # each row's last real token (either padding side)
  token = jnp.argmax(model.logits(hidden[jnp.arange(b), last]), -1).astype(jnp.int32)
  out = [token]
  for _ in range(max_new_tokens - 1):
    hidden, cache = _step(model, token[:, None], cache)
    token = jnp.argmax(model.logits(hidden[:, 0]), -1).astype(jnp.int32)
    out.append(token)
  return np.asarray(jnp.stack(out, 1))
