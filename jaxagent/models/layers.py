"""Building blocks shared by the decoder and the vision towers: norms, projections, RoPE, attention.

Every parameter carries `logical_axes` (names from `jaxagent.sharding.RULES`); activations are constrained
with `sharding.shard`. Projections keep heads as their own axis (`[embed, heads, head_dim]`) so that the
tensor-parallel split falls on whole heads and the HF mapping is a reshape + transpose.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent import sharding

Dtype = Any
_NEG_INF = -1e30  # finite, so that a query row with no visible key gives a uniform softmax, not NaN


def normal_init(std: float):
  return jax.nn.initializers.normal(stddev=std)


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x^2) + eps) * scale, computed in float32 (as Llama and HF do)."""

  def __init__(self, dim: int, *, eps: float = 1e-6, dtype: Dtype = jnp.float32,
               param_dtype: Dtype = jnp.float32):
    self.eps = eps
    self.dtype = dtype
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=("norm",))

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    # HF casts back to the input dtype before multiplying by the weight.
    return self.scale.get_value().astype(self.dtype) * x32.astype(self.dtype)


class Dense(nnx.Module):
  """A projection `x[..., *in] @ kernel[*in, *out] (+ bias[*out])` with named axes on both sides.

  `in_shape`/`out_shape` may have several axes (e.g. `out_shape=(heads, head_dim)`); the kernel is stored
  with exactly those axes, so sharding rules and HF reshapes see whole heads.
  """

  def __init__(self, in_shape: Sequence[int] | int, out_shape: Sequence[int] | int, *,
               in_axes: Sequence[str | None], out_axes: Sequence[str | None], use_bias: bool = False,
               dtype: Dtype = jnp.float32, param_dtype: Dtype = jnp.float32, init_std: float = 0.02,
               rngs: nnx.Rngs):
    self.in_shape = (in_shape,) if isinstance(in_shape, int) else tuple(in_shape)
    self.out_shape = (out_shape,) if isinstance(out_shape, int) else tuple(out_shape)
    self.dtype = dtype
    shape = self.in_shape + self.out_shape
    self.kernel = nnx.Param(normal_init(init_std)(rngs.params(), shape, param_dtype),
                            logical_axes=tuple(in_axes) + tuple(out_axes))
    self.bias = (nnx.Param(jnp.zeros(self.out_shape, param_dtype), logical_axes=tuple(out_axes))
                 if use_bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    """One 2-D matmul over the flattened tokens and features: XLA:CPU's backward pass of a dot_general that
    contracts a [B, T, ...] input over two batch-like axes is ~2x slower than that of its 2-D form."""
    n_in = len(self.in_shape)
    lead = x.shape[:x.ndim - n_in]
    kernel = self.kernel.get_value().astype(self.dtype)
    k_in, k_out = math.prod(self.in_shape), math.prod(self.out_shape)
    if math.prod(lead) == 1 and k_in % ROW_SPLIT == 0 and ROW_SPLIT > 1 and jax.default_backend() == "cpu":
      y = one_row_product(x.astype(self.dtype).reshape(k_in), kernel.reshape(k_in, k_out))
    else:
      y = x.astype(self.dtype).reshape(-1, k_in) @ kernel.reshape(k_in, k_out)
    y = y.reshape(*lead, *self.out_shape)
    if self.bias is not None:
      y = y + self.bias.get_value().astype(self.dtype)
    return y


# A one-row product (decoding one sequence: every projection sees a single token) as this many contraction chunks
# on CPU; 1 turns it off.
ROW_SPLIT = 4


def one_row_product(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`x [K] @ kernel [K, N]`, as ROW_SPLIT partial products over consecutive chunks of K, summed. XLA:CPU runs a
  matrix-vector product on one thread; as a batched product the chunks go to its worker threads: the decode
  step at batch 1, which reads every weight through such products, runs ~1.1-1.3x faster on 2 cores
  (docs/results/performance.md, "one-row products")."""
  k_in, k_out = kernel.shape
  parts = jnp.einsum("cd,cdn->cn", x.reshape(ROW_SPLIT, k_in // ROW_SPLIT),
                     kernel.reshape(ROW_SPLIT, k_in // ROW_SPLIT, k_out))
  return parts.sum(0)


class Embed(nnx.Module):
  """Token embedding table [vocab, embed]; `attend` reuses it as a tied output projection."""

  def __init__(self, vocab_size: int, dim: int, *, dtype: Dtype = jnp.float32,
               param_dtype: Dtype = jnp.float32, init_std: float = 0.02, rngs: nnx.Rngs):
    self.dtype = dtype
    self.embedding = nnx.Param(normal_init(init_std)(rngs.params(), (vocab_size, dim), param_dtype),
                               logical_axes=("vocab", "embed"))

  def __call__(self, ids: jax.Array) -> jax.Array:
    return jnp.take(self.embedding.get_value(), ids, axis=0).astype(self.dtype)

  def attend(self, x: jax.Array) -> jax.Array:
    """Tied logits [..., V], as one 2-D product over the flattened tokens (see `logits_2d`)."""
    return logits_2d(x.astype(self.dtype), self.embedding.get_value().astype(self.dtype).T)


def logits_2d(hidden: jax.Array, kernel: jax.Array) -> jax.Array:
  """float32 logits [..., V] of `hidden` [..., E] through `kernel` [E, V], as one 2-D product over the flattened
  tokens. Written as an einsum over [B, T, E], its backward made XLA:CPU write the log-softmax gradient
  transposed ([V, B·T]) inside the fusion that computes it: 22 of the tiny VLM's 159 ms train step; the 2-D
  form takes 117 ms (docs/results/performance.md, "2-D logits")."""
  out = jnp.dot(hidden.reshape(-1, hidden.shape[-1]), kernel, preferred_element_type=jnp.float32)
  return out.reshape(*hidden.shape[:-1], kernel.shape[-1])


# ----------------------------------------------------------------------------------------------------
# Rotary position embeddings


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> jax.Array:
  """Inverse frequencies [head_dim/2] (float32), with Llama-3 frequency scaling when asked.

  Llama-3 scaling (HF `_compute_llama3_parameters`): wavelengths longer than
  `original_max_position_embeddings / low_freq_factor` are divided by `factor`, shorter than
  `.../high_freq_factor` kept, and the band in between interpolated smoothly.
  """
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  if not scaling:
    return inv_freq
  kind = scaling.get("rope_type", scaling.get("type"))
  if kind in (None, "default"):
    return inv_freq
  if kind == "linear":
    return inv_freq / scaling["factor"]
  if kind != "llama3":
    raise NotImplementedError(f"rope_scaling.rope_type={kind!r} is not supported; use None, 'linear' or 'llama3'")
  factor = scaling["factor"]
  low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
  old_len = scaling["original_max_position_embeddings"]
  low_wavelen, high_wavelen = old_len / low, old_len / high
  wavelen = 2 * math.pi / inv_freq
  scaled = jnp.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
  smooth = (old_len / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(medium, smoothed, scaled)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotate x [B, T, H, D] by positions [B, T], HF's 'rotate_half' convention (split halves, not pairs)."""
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  cos = jnp.concatenate([cos, cos], -1).astype(x.dtype)
  sin = jnp.concatenate([sin, sin], -1).astype(x.dtype)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return x * cos + rotated * sin


# ----------------------------------------------------------------------------------------------------
# Attention


def attention_mask(q_slots: jax.Array, k_slots: jax.Array, k_valid: jax.Array,
                   q_positions: jax.Array | None = None, k_positions: jax.Array | None = None,
                   sliding_window: int | None = None, segment_ids: jax.Array | None = None) -> jax.Array:
  """Boolean mask [B, 1, T, S]: causal in slot order, only valid keys, optionally a sliding window and, for packed
  rows (`segment_ids` [B, T] over the input itself), only keys of the query's own segment.

  Slots are indices into the key sequence (the cache, or the input itself); positions are RoPE
  positions, used for the window so that padding holes do not count against it. A key is inside the
  window when `q_pos - k_pos < sliding_window` (HF Mistral).
  """
  mask = (k_slots[:, None, :] <= q_slots[:, :, None]) & k_valid[:, None, :]
  if sliding_window is not None:
    mask &= (q_positions[:, :, None] - k_positions[:, None, :]) < sliding_window
  if segment_ids is not None:
    mask &= segment_ids[:, :, None] == segment_ids[:, None, :]
  return mask[:, None]


def segment_positions(segment_ids: jax.Array) -> jax.Array:
  """RoPE positions [B, T] of packed rows: each token's offset from the start of its (contiguous) segment."""
  t = segment_ids.shape[-1]
  slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), segment_ids.shape)
  starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], 1)
  return slots - jax.lax.cummax(jnp.where(starts, slots, 0), axis=1)


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """Grouped-query attention. q [B,T,H,D], k/v [B,S,K,D] with H % K == 0, mask [B,1,T,S] -> [B,T,H,D].

  Scores and softmax in float32; query heads are grouped per key head without repeating k/v in memory. Heads
  are moved in front of the sequence explicitly: XLA:CPU runs the two batched matmuls and their gradients about
  twice as fast in that layout as an einsum over [B, T, K, G, D] (benchmarks/train_step.py).
  """
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  groups = h // kv_heads
  q = q.reshape(b, t, kv_heads, groups, d).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, D]
  k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, S, D]
  scores = jnp.einsum("bkgtd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) / math.sqrt(d)
  scores = jnp.where(mask[:, :, None], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bksd->bkgtd", probs, v)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def causal_block_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, block_rows: int = 64,
                           max_blocks: int = 8) -> jax.Array:
  """`dot_product_attention` for a mask causal in slot order over the input itself (no cache), with the query
  rows in blocks, each against the keys up to its own last row: the scores of the blocks above the diagonal, all
  masked, are never computed (at 5 blocks 40 % fewer). The same result, as those keys carry no weight; on the
  2-core CPU the tiny decoder's train step is ~1.2x faster (benchmarks/train_step.py)."""
  t = q.shape[1]
  rows = max(block_rows, -(-t // max_blocks))
  if t != k.shape[1] or t <= rows:
    return dot_product_attention(q, k, v, mask)
  outs = []
  for start in range(0, t, rows):
    end = min(t, start + rows)
    outs.append(dot_product_attention(q[:, start:end], k[:, :end], v[:, :end], mask[:, :, start:end, :end]))
  return jnp.concatenate(outs, axis=1)


# How a decoder's training and scoring forward pass computes attention (`config.model.attention`): "xla" is
# `causal_block_attention` above; "cudnn" is cuDNN's fused flash-attention kernel through
# `jax.nn.dot_product_attention` (GPU only, bf16/fp16), ~5x faster forward + backward on an H200 at 1B scale
# (benchmarks/accelerator.py). Decoding with a KV cache always takes the XLA path.
ATTENTION_IMPLS = ("xla", "cudnn")


def fused_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                           implementation: str = "cudnn") -> jax.Array:
  """`dot_product_attention`'s contract through `jax.nn.dot_product_attention`, for a mask that is causal in slot
  order (`attention_mask` over the input itself, no cache): `is_causal` lets a fused kernel skip the blocks above
  the diagonal; the mask itself (padding, sliding window) still applies."""
  return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, implementation=implementation)


def shard_heads(x: jax.Array, kv: bool = False) -> jax.Array:
  return sharding.shard(x, ("batch", "length", "act_kv_heads" if kv else "act_heads", None))


# What a block's backward pass keeps from its forward pass (`config.model.remat`): "none" keeps everything (no
# rematerialisation), "full" keeps only the block's inputs and recomputes the rest, "dots" keeps the matmul
# outputs and recomputes the elementwise work, "dots_no_batch" keeps only matmuls without batch dimensions (the
# weight products, not attention's scores). jax.checkpoint's policies: docs.jax.dev "gradient-checkpointing".
REMAT_POLICIES = {"none": None, "full": jax.checkpoint_policies.nothing_saveable,
                  "dots": jax.checkpoint_policies.dots_saveable,
                  "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def remat_name(remat: str | bool | None) -> str:
  """A config's `remat` as a policy name: True (a config written before the names) is "full", False "none"."""
  if isinstance(remat, bool) or remat is None:
    return "full" if remat else "none"
  if remat not in REMAT_POLICIES:
    raise ValueError(f"remat={remat!r} is not one of {tuple(REMAT_POLICIES)}")
  return remat


def remat(fn, policy: str | bool | None):
  """`fn` under `nnx.remat` with the named policy (`REMAT_POLICIES`); `fn` itself for "none"."""
  name = remat_name(policy)
  return fn if name == "none" else nnx.remat(fn, policy=REMAT_POLICIES[name])
