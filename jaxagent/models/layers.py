"""Building blocks shared by the decoder and the vision towers: norms, projections, RoPE, attention.

Every parameter carries `logical_axes` (names from `jaxagent.sharding.RULES`); activations are constrained
with `sharding.shard`. Projections keep heads as their own axis (`[embed, heads, head_dim]`) so that the
tensor-parallel split falls on whole heads and the HF mapping is a reshape + transpose.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

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
      y = matmul(x.astype(self.dtype).reshape(-1, k_in), kernel.reshape(k_in, k_out))
    y = checkpoint_name(y, PROJECTION).reshape(*lead, *self.out_shape)
    if self.bias is not None:
      y = y + self.bias.get_value().astype(self.dtype)
    return y


# A one-row product (decoding one sequence: every projection sees a single token) as this many contraction chunks
# on CPU; 1 turns it off.
ROW_SPLIT = 4

# On CPU, bfloat16 products written out in float32 (then rounded to bfloat16): XLA:CPU lowers a product with a
# bfloat16 result as both operands converted to float32, a float32 product and a conversion back, slower than
# float32 itself; with a float32 result its matmul library takes the bfloat16 operands as they are
# (docs/results/performance.md, "bfloat16 on CPU"). False: the plain bfloat16 product.
CPU_BF16_FLOAT32_RESULT = True


def product_type(dtype) -> Any:
  """The `preferred_element_type` of a product in `dtype`: float32 for bfloat16 on CPU (`CPU_BF16_FLOAT32_RESULT`),
  else None (the operands' type)."""
  if CPU_BF16_FLOAT32_RESULT and jnp.dtype(dtype) == jnp.bfloat16 and jax.default_backend() == "cpu":
    return jnp.float32
  return None


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
  """`x [M, K] @ w [K, N]` in their dtype; bfloat16 on CPU through `bf16_matmul`, whose backward products also take
  bfloat16 operands (JAX's own backward of a float32-result product multiplies the float32 cotangent by the
  bfloat16 operands, which XLA:CPU runs as float32 products)."""
  if product_type(x.dtype) is None:
    return x @ w
  return bf16_matmul(x, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def bf16_matmul(x: jax.Array, w: jax.Array, float32_out: bool = False, w_transposed: bool = False) -> jax.Array:
  """bfloat16 `x [M, K] @ w [K, N]` (or `@ w.T` of a `w` [N, K] stored so: `w_transposed`, a tied embedding) with
  float32 results, rounded to bfloat16 (or kept, `float32_out`: logits), forward and backward. Every product is
  written in a form XLA:CPU's matmul library takes in bfloat16; `x @ w.T` as a transposed operand ran as a
  float32 product of converted operands (see `materialized_transpose`)."""
  out = jax.lax.dot_general(x, w, (((1,), (1 if w_transposed else 0,)), ((), ())),
                            preferred_element_type=jnp.float32)
  return out if float32_out else out.astype(x.dtype)


def _bf16_matmul_fwd(x, w, float32_out, w_transposed):
  return bf16_matmul(x, w, float32_out, w_transposed), (x, w)


def _bf16_matmul_bwd(float32_out, w_transposed, residuals, g):
  del float32_out
  x, w = residuals
  g = g.astype(x.dtype)
  dx = jax.lax.dot_general(g, w, (((1,), (0 if w_transposed else 1,)), ((), ())), preferred_element_type=jnp.float32)
  # dw = x.T @ g [K, N], or g.T @ x [N, K]: the left operand contracted over the tokens, transposed first.
  left, right = (g, x) if w_transposed else (x, g)
  left_t = materialized_transpose(left)
  if left_t is None:
    dw = jax.lax.dot_general(left, right, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
  else:
    dw = jax.lax.dot_general(left_t, right, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
  return dx.astype(x.dtype), dw.astype(w.dtype)


bf16_matmul.defvjp(_bf16_matmul_fwd, _bf16_matmul_bwd)


def materialized_transpose(x: jax.Array) -> jax.Array | None:
  """`x` with its last two axes swapped, written so that XLA:CPU stores it transposed before the product that reads
  it; None where neither axis is even.

  XLA:CPU's matmul library takes bfloat16 operands only with the left one's contracted dimension last, and it
  decides before any transpose is materialized: `x.T @ g` (a weight's gradient, contracted over the tokens) and
  `x.T` as a plain transpose (a column-major view of `x`) both ran as float32 products of converted operands, at
  half the bfloat16 rate. Through a reshape that splits an even axis, the transposed copy is laid out row-major
  first and the product takes it in bfloat16 (docs/results/performance.md, "Zen 4")."""
  *lead, m, k = x.shape
  n = len(lead)
  if m % 2 == 0:
    split, order = (*lead, m // 2, 2, k), (n + 2, n, n + 1)
  elif k % 2 == 0:
    split, order = (*lead, m, k // 2, 2), (n + 1, n + 2, n)
  else:
    return None
  return x.reshape(split).transpose(*range(n), *order).reshape(*lead, k, m)


def one_row_product(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`x [K] @ kernel [K, N]`, as ROW_SPLIT partial products over consecutive chunks of K, summed. XLA:CPU runs a
  matrix-vector product on one thread; as a batched product the chunks go to its worker threads: the decode
  step at batch 1, which reads every weight through such products, runs ~1.1-1.3x faster on 2 cores
  (docs/results/performance.md, "one-row products")."""
  k_in, k_out = kernel.shape
  parts = jnp.einsum("cd,cdn->cn", x.reshape(ROW_SPLIT, k_in // ROW_SPLIT),
                     kernel.reshape(ROW_SPLIT, k_in // ROW_SPLIT, k_out), preferred_element_type=product_type(x.dtype))
  return parts.sum(0).astype(x.dtype)


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
    return logits_2d(x.astype(self.dtype), self.embedding.get_value().astype(self.dtype), kernel_transposed=True)


def logits_2d(hidden: jax.Array, kernel: jax.Array, kernel_transposed: bool = False) -> jax.Array:
  """float32 logits [..., V] of `hidden` [..., E] through `kernel` [E, V] (or [V, E], `kernel_transposed`: a tied
  embedding, read as it is stored), as one 2-D product over the flattened tokens. Written as an einsum over
  [B, T, E], its backward made XLA:CPU write the log-softmax gradient transposed ([V, B·T]) inside the fusion that
  computes it: 22 of the tiny VLM's 159 ms train step; the 2-D form takes 117 ms (docs/results/performance.md,
  "2-D logits")."""
  flat = hidden.reshape(-1, hidden.shape[-1])
  if product_type(hidden.dtype) is not None and kernel.dtype == hidden.dtype:  # bfloat16 on CPU: see `matmul`
    out = bf16_matmul(flat, kernel, True, kernel_transposed)
  else:
    out = jnp.dot(flat, kernel.T if kernel_transposed else kernel, preferred_element_type=jnp.float32)
  return out.reshape(*hidden.shape[:-1], kernel.shape[0 if kernel_transposed else -1])


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
                   sliding_window: int | None = None, segment_ids: jax.Array | None = None,
                   k_segment_ids: jax.Array | None = None) -> jax.Array:
  """Boolean mask [B, 1, T, S]: causal in slot order, only valid keys, optionally a sliding window and, for packed
  rows (`segment_ids` [B, T] of the queries, `k_segment_ids` [B, S] of the keys, by default the same: the input
  itself), only keys of the query's own segment.

  Slots are indices into the key sequence (the cache, or the input itself); positions are RoPE
  positions, used for the window so that padding holes do not count against it. A key is inside the
  window when `q_pos - k_pos < sliding_window` (HF Mistral).
  """
  mask = (k_slots[:, None, :] <= q_slots[:, :, None]) & k_valid[:, None, :]
  if sliding_window is not None:
    mask &= (q_positions[:, :, None] - k_positions[:, None, :]) < sliding_window
  if segment_ids is not None:
    k_segment_ids = segment_ids if k_segment_ids is None else k_segment_ids
    mask &= segment_ids[:, :, None] == k_segment_ids[:, None, :]
  return mask[:, None]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SelfMask:
  """The mask of attention over the input itself (no cache), kept as per-token vectors [B, T]: `dense()` is
  `attention_mask`'s [B, 1, T, T]; `block(q0, k0, size)` is one [B, size, size] tile of it, what a blockwise
  kernel builds so that no T x T array exists at once."""
  valid: jax.Array  # a real token (keys that are not may not be attended to)
  positions: jax.Array  # RoPE positions, for the sliding window
  segment_ids: jax.Array | None = None  # packed rows: attention stays within a segment
  sliding_window: int | None = dataclasses.field(default=None, metadata=dict(static=True))

  def dense(self) -> jax.Array:
    slots = jnp.broadcast_to(jnp.arange(self.valid.shape[1], dtype=jnp.int32), self.valid.shape)
    return attention_mask(slots, slots, self.valid, self.positions, self.positions, self.sliding_window,
                          self.segment_ids)

  def block(self, q0: jax.Array, k0: jax.Array, size: int) -> jax.Array:
    """Rows [q0, q0 + size) x columns [k0, k0 + size) of `dense()[:, 0]`, for traced offsets."""
    take = lambda x, at: jax.lax.dynamic_slice_in_dim(x, at, size, axis=1)
    q_slots = jnp.broadcast_to(q0 + jnp.arange(size, dtype=jnp.int32), (self.valid.shape[0], size))
    k_slots = jnp.broadcast_to(k0 + jnp.arange(size, dtype=jnp.int32), (self.valid.shape[0], size))
    segments = (None, None) if self.segment_ids is None else (take(self.segment_ids, q0), take(self.segment_ids, k0))
    return attention_mask(q_slots, k_slots, take(self.valid, k0), take(self.positions, q0),
                          take(self.positions, k0), self.sliding_window, *segments)[:, 0]

  def padded(self, length: int) -> "SelfMask":
    """The same mask over `length` >= T tokens, the added ones invalid (and in segment 0, no sample's)."""
    pad = lambda x: None if x is None else jnp.pad(x, ((0, 0), (0, length - x.shape[1])))
    return SelfMask(pad(self.valid), pad(self.positions), pad(self.segment_ids), self.sliding_window)


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
  probs = _grouped_probs(q, k, mask).astype(v.dtype)
  out = jnp.einsum("bkgts,bksd->bkgtd", probs, v, preferred_element_type=product_type(v.dtype)).astype(v.dtype)
  return checkpoint_name(out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d), ATTENTION)


def _grouped_probs(q: jax.Array, k: jax.Array, mask: jax.Array) -> jax.Array:
  """float32 attention probabilities [B, K, G, T, S] of heads-first `q` [B, K, G, T, D] over `k` [B, K, S, D]
  under `mask` [B, 1, T, S]."""
  scores = jnp.einsum("bkgtd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
  return jax.nn.softmax(jnp.where(mask[:, :, None], scores, _NEG_INF), axis=-1)


def causal_block_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, block_rows: int = 64,
                           max_blocks: int = 8) -> jax.Array:
  """`dot_product_attention` for a mask causal in slot order, with the query rows in blocks, each against the keys
  up to its own last row: the scores of the blocks above the diagonal, all masked, are never computed (at 5 blocks
  40 % fewer). The same result, as those keys carry no weight. Over the input itself (T = S) the 2-core CPU runs
  the tiny decoder's train step ~1.2x faster (benchmarks/train_step.py); in bfloat16 on CPU it takes its own
  backward (`_bf16_causal_blocks`), one block or more. Over a cache (S > T: a prompt prefilled after the keys an
  earlier one left, `serving.prefix_cache`), query row r sits at a slot ≤ S - T + r, as the cache protocol has it
  (a call writes its T tokens from the next free slot, and no later slot holds a key it may see)."""
  t, s = q.shape[1], k.shape[1]
  rows = max(block_rows, -(-t // max_blocks))
  if t > s:
    raise ValueError(f"causal_block_attention: {t} queries over {s} keys; a causal mask needs as many keys or more")
  if t != s:
    return _causal_blocks_forward(q, k, v, mask, min(rows, t))[0]
  if product_type(q.dtype) is not None and q.dtype == k.dtype == v.dtype:  # bfloat16 on CPU
    return checkpoint_name(_bf16_causal_blocks(q, k, v, mask, min(rows, t)), ATTENTION)
  if t <= rows:
    return dot_product_attention(q, k, v, mask)
  outs = []
  for start in range(0, t, rows):
    end = min(t, start + rows)
    outs.append(dot_product_attention(q[:, start:end], k[:, :end], v[:, :end], mask[:, :, start:end, :end]))
  return jnp.concatenate(outs, axis=1)


def _causal_blocks_forward(q, k, v, mask, rows):
  """`causal_block_attention`'s blocks, in the heads-first layout: the output [B, T, H, D] and each query block's
  float32 probabilities [B, K, G, rows, S - T + end] (the keys up to its last row's slot)."""
  b, t, h, d = q.shape
  kv_heads, offset = k.shape[2], k.shape[1] - t
  qh = q.reshape(b, t, kv_heads, h // kv_heads, d).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, D]
  kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, S, D]
  outs, probs = [], []
  for start in range(0, t, rows):
    end = min(t, start + rows)
    keys = offset + end
    p = _grouped_probs(qh[:, :, :, start:end], kh[:, :, :keys], mask[:, :, start:end, :keys])
    outs.append(jnp.einsum("bkgts,bksd->bkgtd", p.astype(v.dtype), vh[:, :, :keys],
                           preferred_element_type=jnp.float32).astype(v.dtype))
    probs.append(p)
  return jnp.concatenate(outs, axis=3).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d), probs


def _contract_rows(x: jax.Array, y: jax.Array) -> jax.Array:
  """`x [B, K, M, N]`, `y [B, K, M, D]` -> float32 `x.T @ y` [B, K, N, D] over M, `x` transposed first
  (`materialized_transpose`: the form XLA:CPU's library takes in bfloat16)."""
  x_t = materialized_transpose(x)
  if x_t is None:
    return jnp.einsum("bkmn,bkmd->bknd", x, y, preferred_element_type=jnp.float32)
  return jax.lax.dot_general(x_t, y, (((3,), (2,)), ((0, 1), (0, 1))), preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _bf16_causal_blocks(q, k, v, mask, rows):
  """`causal_block_attention` in bfloat16 on CPU, with a backward whose products all take bfloat16 operands and
  whose key and value gradients are summed in float32 block by block. Through autodiff, each query block's key
  and value gradients were padded to full length and summed in bfloat16, converted at every addition, and the
  products' backward multiplied float32 cotangents: SmolLM2's bfloat16 LoRA step spent more in that than in
  attention's products (docs/results/performance.md, "Zen 4")."""
  return _causal_blocks_forward(q, k, v, mask, rows)[0]


def _bf16_causal_blocks_fwd(q, k, v, mask, rows):
  out, probs = _causal_blocks_forward(q, k, v, mask, rows)
  return out, (q, k, v, mask, probs)


def _bf16_causal_blocks_bwd(rows, residuals, d_out):
  q, k, v, mask, probs = residuals
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  g = h // kv_heads
  qh = q.reshape(b, t, kv_heads, g, d).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, D]
  kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, S, D]
  d_oh = d_out.astype(v.dtype).reshape(b, t, kv_heads, g, d).transpose(0, 2, 3, 1, 4)
  starts = list(range(0, t, rows))
  dq, dk_parts, dv_parts = [], [[] for _ in starts], [[] for _ in starts]
  for i, start in enumerate(starts):
    end = min(t, start + rows)
    p, d_oi = probs[i], d_oh[:, :, :, start:end]
    dp = jnp.einsum("bkgtd,bksd->bkgts", d_oi, vh[:, :, :end], preferred_element_type=jnp.float32)
    ds = (p * (dp - jnp.sum(p * dp, axis=-1, keepdims=True)) / math.sqrt(d)).astype(q.dtype)
    dq.append(jnp.einsum("bkgts,bksd->bkgtd", ds, kh[:, :, :end], preferred_element_type=jnp.float32))
    flat = lambda x: x.reshape(b, kv_heads, g * (end - start), x.shape[-1])  # [B, K, G·rows, ...]
    dv_i = _contract_rows(flat(p.astype(v.dtype)), flat(d_oi))  # [B, K, end, D]
    dk_i = _contract_rows(flat(ds), flat(qh[:, :, :, start:end]))
    for j, key_start in enumerate(starts[:i + 1]):  # block j of the keys gets its rows of both
      key_end = min(t, key_start + rows)
      dk_parts[j].append(dk_i[:, :, key_start:key_end])
      dv_parts[j].append(dv_i[:, :, key_start:key_end])
  whole = lambda parts: jnp.concatenate([sum(block[1:], block[0]) for block in parts], axis=2)  # [B, K, S, D]
  dq = jnp.concatenate(dq, axis=3).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype)
  return (dq, whole(dk_parts).transpose(0, 2, 1, 3).astype(k.dtype),
          whole(dv_parts).transpose(0, 2, 1, 3).astype(v.dtype), None)


_bf16_causal_blocks.defvjp(_bf16_causal_blocks_fwd, _bf16_causal_blocks_bwd)


# Query and key rows of one `flash_attention` tile: its scores are [B, K, G, 512, 512] float32 (SmolLM2's 9 heads
# at batch 2: 18 MiB) at any sequence length.
FLASH_BLOCK = 512


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: SelfMask, block: int | None = None) -> jax.Array:
  """`dot_product_attention` over the input itself (no cache), in [block x block] tiles (default `FLASH_BLOCK`) with
  an online softmax (FlashAttention-2, Dao 2023, arXiv:2307.08691): the forward keeps only the output and each
  row's log-sum-exp, and the backward recomputes each tile's probabilities from them, so no T x T array is kept or built at once and
  memory grows linearly with T. Tiles above the diagonal, all masked, are skipped. Equal to
  `dot_product_attention` within float32 rounding, values and gradients, on every row with a visible key (a row
  with none, padding, averages a prefix of the values instead of all of them)."""
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  size = min(block or FLASH_BLOCK, t)
  padded = -(-t // size) * size
  pad = lambda x: jnp.pad(x, ((0, 0), (0, padded - t), (0, 0), (0, 0)))
  qh = pad(q).reshape(b, padded, kv_heads, h // kv_heads, d).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, D]
  kh, vh = pad(k).transpose(0, 2, 1, 3), pad(v).transpose(0, 2, 1, 3)  # [B, K, T, D]
  out = _flash(qh, kh, vh, mask.padded(padded), size)
  return out[:, :, :, :t].transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def _tile_scores(q: jax.Array, k: jax.Array, mask: jax.Array) -> jax.Array:
  """Scaled float32 scores of one tile, q [B, K, G, n, D] x k [B, K, n, D], masked entries at _NEG_INF."""
  scores = jnp.einsum("bkgtd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
  return jnp.where(mask[:, None, None], scores, _NEG_INF)


def _flash_forward(q, k, v, mask: SelfMask, size: int):
  """(out [B, K, G, T, D] in q's dtype, log-sum-exp [B, K, G, T] float32): query tiles one after another, each
  over the key tiles up to its own."""
  f32 = jnp.float32

  def query_tile(i):
    q_i = jax.lax.dynamic_slice_in_dim(q, i * size, size, axis=3)

    def key_tile(j, carry):
      m, l, acc = carry
      k_j, v_j = (jax.lax.dynamic_slice_in_dim(x, j * size, size, axis=2) for x in (k, v))
      s = _tile_scores(q_i, k_j, mask.block(i * size, j * size, size))
      m_new = jnp.maximum(m, s.max(-1))
      p = jnp.exp(s - m_new[..., None])
      corr = jnp.exp(m - m_new)
      acc = acc * corr[..., None] + jnp.einsum("bkgts,bksd->bkgtd", p.astype(v.dtype), v_j,
                                               preferred_element_type=f32)
      return m_new, l * corr + p.sum(-1), acc

    shape = q_i.shape[:-1]
    m, l, acc = jax.lax.fori_loop(0, i + 1, key_tile, (jnp.full(shape, _NEG_INF, f32), jnp.zeros(shape, f32),
                                                       jnp.zeros(q_i.shape, f32)))
    return (acc / l[..., None]).astype(q.dtype), m + jnp.log(l)

  out, lse = jax.lax.map(query_tile, jnp.arange(q.shape[3] // size))  # [n, B, K, G, size, ...]
  return (jnp.moveaxis(out, 0, 3).reshape(q.shape), jnp.moveaxis(lse, 0, 3).reshape(q.shape[:-1]))


def _flash_backward(q, k, v, mask: SelfMask, out, lse, g, size: int):
  """(dq, dk, dv) of `_flash_forward`: key tiles one after another, each over the query tiles from its own on,
  every tile's probabilities recomputed from `lse` (FlashAttention-2's backward).

  The key and value gradients contract a tile's probabilities over its query rows. Written `p.T @ g`, each tile's
  [G x n, n] probabilities and score gradients were copied transposed first, which XLA:CPU does at ~1 GB/s: in
  float32, a third of the backward's time at 4,096 tokens. Here they accumulate transposed, `g.T @ p` [D, n], from q
  and g transposed once per call (docs/results/performance.md#projections)."""
  f32, scale = jnp.float32, 1.0 / math.sqrt(q.shape[-1])
  b, kv, groups, t, d = q.shape
  delta = jnp.sum(g.astype(f32) * out.astype(f32), -1)  # [B, K, G, T]: rowsum(dO * O)
  rows = lambda x, i: jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=3)
  # [B, K, D, G, T]: a query tile's rows of every group, as the left operand of a product over them.
  columns = lambda x: _swap_last(x.reshape(b, kv, groups * t, d)).reshape(b, kv, d, groups, t)
  q_t, g_t = columns(q), columns(g)
  tile_t = lambda x, i: jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=4).reshape(b, kv, d, groups * size)
  over_rows = lambda x_t, y: jax.lax.dot_general(  # [B, K, D, G n] @ [B, K, G n, n] -> [B, K, D, n]
      x_t, y.reshape(b, kv, groups * size, size), (((3,), (2,)), ((0, 1), (0, 1))), preferred_element_type=f32)

  def key_tile(dq, j):
    k_j, v_j = (jax.lax.dynamic_slice_in_dim(x, j * size, size, axis=2) for x in (k, v))

    def query_tile(i, carry):
      dq, dk_j, dv_j = carry
      q_i, g_i, lse_i, delta_i = rows(q, i), rows(g, i), rows(lse, i), rows(delta, i)
      p = jnp.exp(_tile_scores(q_i, k_j, mask.block(i * size, j * size, size)) - lse_i[..., None])
      dv_j += over_rows(tile_t(g_t, i), p.astype(g.dtype))
      dp = jnp.einsum("bkgtd,bksd->bkgts", g_i, v_j, preferred_element_type=f32)
      ds = p * (dp - delta_i[..., None]) * scale
      dk_j += over_rows(tile_t(q_t, i), ds.astype(q.dtype))
      dq_i = rows(dq, i) + jnp.einsum("bkgts,bksd->bkgtd", ds.astype(k.dtype), k_j, preferred_element_type=f32)
      return jax.lax.dynamic_update_slice_in_dim(dq, dq_i, i * size, axis=3), dk_j, dv_j

    zeros = jnp.zeros((b, kv, d, size), f32)
    dq, dk_j, dv_j = jax.lax.fori_loop(j, t // size, query_tile, (dq, zeros, zeros))
    return dq, (dk_j, dv_j)

  dq, (dk, dv) = jax.lax.scan(key_tile, jnp.zeros(q.shape, f32), jnp.arange(k.shape[2] // size))
  joined = lambda x: jnp.moveaxis(x, 0, 2).swapaxes(-1, -2).reshape(k.shape)  # [n, B, K, D, size] -> [B, K, S, D]
  return dq.astype(q.dtype), joined(dk).astype(k.dtype), joined(dv).astype(v.dtype)


def _swap_last(x: jax.Array) -> jax.Array:
  """`x` with its last two axes swapped, stored so (`materialized_transpose`) where one of them is even."""
  swapped = materialized_transpose(x)
  return jnp.swapaxes(x, -1, -2) if swapped is None else swapped


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, mask: SelfMask, size: int):
  return _flash_forward(q, k, v, mask, size)[0]


def _flash_fwd(q, k, v, mask, size):
  out, lse = (checkpoint_name(x, ATTENTION) for x in _flash_forward(q, k, v, mask, size))
  return out, (q, k, v, mask, out, lse)


def _flash_bwd(size, residuals, g):
  q, k, v, mask, out, lse = residuals
  return (*_flash_backward(q, k, v, mask, out, lse, g, size), None)


_flash.defvjp(_flash_fwd, _flash_bwd)


# How a decoder's training and scoring forward pass computes attention (`config.model.attention`): "xla" is
# `causal_block_attention` above; "flash" is `flash_attention` above (memory linear in the sequence length: the
# long-context training path, on any backend); "cudnn" is cuDNN's fused flash-attention kernel through
# `jax.nn.dot_product_attention` (GPU only, bf16/fp16), ~5x faster forward + backward on an H200 at 1B scale
# (benchmarks/accelerator.py). Decoding with a KV cache always takes the XLA path.
ATTENTION_IMPLS = ("xla", "flash", "cudnn")


def fused_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                           implementation: str = "cudnn") -> jax.Array:
  """`dot_product_attention`'s contract through `jax.nn.dot_product_attention`, for a mask that is causal in slot
  order (`attention_mask` over the input itself, no cache): `is_causal` lets a fused kernel skip the blocks above
  the diagonal; the mask itself (padding, sliding window) still applies."""
  return checkpoint_name(jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True,
                                                      implementation=implementation), ATTENTION)


def shard_heads(x: jax.Array, kv: bool = False) -> jax.Array:
  return sharding.shard(x, ("batch", "length", "act_kv_heads" if kv else "act_heads", None))


# The names `checkpoint_name` gives what a remat policy may keep: every `Dense`'s product, and every attention
# kernel's output with what its backward reads besides q, k and v (flash's log-sum-exp). A product inside a
# `custom_vjp` (`bf16_matmul`, the bfloat16 and flash kernels) is no `dot_general` to JAX's dots policies.
PROJECTION, ATTENTION = "projection", "attention"

# What a block's backward pass keeps from its forward pass (`config.model.remat`): "none" keeps everything (no
# rematerialisation), "full" keeps only the block's inputs and recomputes the rest, "dots" keeps the matmul
# outputs and recomputes the elementwise work, "dots_no_batch" keeps only matmuls without batch dimensions (the
# weight products, not attention's scores), "projections" keeps the projections' and the attention kernels'
# outputs and recomputes the elementwise work only: with `attention=flash`, memory linear in T and no attention
# recomputed. jax.checkpoint's policies: docs.jax.dev "gradient-checkpointing".
_names = jax.checkpoint_policies.save_only_these_names
REMAT_POLICIES = {
    "none": None, "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.save_from_both_policies(jax.checkpoint_policies.dots_saveable,
                                                            _names(PROJECTION, ATTENTION)),
    "dots_no_batch": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable, _names(PROJECTION)),
    "projections": _names(PROJECTION, ATTENTION)}


def remat_name(remat: str | bool | None) -> str:
  """A config's `remat` as a policy name: True (a config written before the names) is "full", False "none"."""
  if isinstance(remat, bool) or remat is None:
    return "full" if remat else "none"
  if remat not in REMAT_POLICIES:
    raise ValueError(f"remat={remat!r} is not one of {tuple(REMAT_POLICIES)}")
  return remat


def remat(fn, policy: str | bool | None):
  """`fn(module, *args)` under `jax.checkpoint` with the named policy (`REMAT_POLICIES`); `fn` itself for "none".

  The module enters as its state, merged inside: `nnx.remat` would write the traced parameters back into the
  module's variables, which a train step that differentiates only some of them (LoRA's adapters, the rest
  closed over) refuses as a mutation from another trace level."""
  name = remat_name(policy)
  if name == "none":
    return fn

  def wrapped(module, *args):
    graphdef, state = nnx.split(module)
    pure = lambda state, *args: fn(nnx.merge(graphdef, state), *args)
    return _recompute_late(jax.checkpoint(pure, policy=REMAT_POLICIES[name]), state, *args)

  return wrapped


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _recompute_late(f, *args):
  """`f(*args)`, whose backward starts only once its output's cotangent exists. XLA:CPU's scheduler otherwise
  runs every block's recomputation as soon as the block's inputs exist, early in the backward pass, so that all
  of them are alive together and remat saves almost nothing (a 30-layer SmolLM2 step at 2 x 4096 tokens: 19.0
  GB of temporaries with remat=full, 20.4 without; docs/results/performance.md, "Long context")."""
  return f(*args)


def _recompute_late_fwd(f, *args):
  return jax.vjp(f, *args)  # the output, and the backward with what the remat policy saved


def _recompute_late_bwd(f, backward, cotangent):
  """`backward(cotangent)` with every float residual plus a zero computed from the cotangent: the recomputation
  then waits for it, and XLA cannot merge it with the forward's identical ops (XLA:CPU drops the optimization
  barriers `jax.checkpoint` places against that before its CSE pass)."""
  del f
  leaf = next(x for x in jax.tree.leaves(cotangent) if jnp.issubdtype(x.dtype, jnp.floating))
  zero = leaf.reshape(-1)[0].astype(jnp.float32) * 0.0  # NaN only where the gradient would be NaN anyway
  shift = lambda r: r + zero.astype(r.dtype) if jnp.issubdtype(r.dtype, jnp.floating) else r
  return jax.tree.map(shift, backward)(cotangent)


_recompute_late.defvjp(_recompute_late_fwd, _recompute_late_bwd)
