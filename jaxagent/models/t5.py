"""T5 (encoder-decoder) as Flax NNX modules, the base of AutoUI (`models/autoui.py`), DigiRL's and Digi-Q's actor.

As `transformers.T5ForConditionalGeneration`: RMS layer norms without bias (`T5LayerNorm`), attention without the
1/sqrt(d) scale (folded into T5's initialisation), a learned relative-position bias computed by the first layer of
each stack and added in every layer (bidirectional buckets in the encoder, causal in the decoder, none in the
cross-attention), ReLU (`t5`) or gated-GELU (`t5-v1.1`, FLAN-T5) feed-forward blocks, and, when the embeddings
are tied, the decoder output scaled by d_model^-0.5 before the head. Parameter names follow HF's.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent.models import layers, llama

FEED_FORWARD = ("relu", "gated-gelu", "gated-silu")
_NEG = -1e30


@dataclasses.dataclass(frozen=True)
class T5Config:
  vocab_size: int
  d_model: int = 512
  d_kv: int = 64
  d_ff: int = 2048
  num_layers: int = 6
  num_decoder_layers: int = 6
  num_heads: int = 8
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  feed_forward: str = "relu"  # HF `feed_forward_proj`
  layer_norm_eps: float = 1e-6
  tie_word_embeddings: bool = True
  pad_token_id: int = 0
  eos_token_id: int = 1
  decoder_start_token_id: int = 0
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    if self.feed_forward not in FEED_FORWARD:
      raise ValueError(f"T5Config.feed_forward={self.feed_forward!r} is not one of {FEED_FORWARD}")

  @classmethod
  def from_hf(cls, hf: dict, **overrides) -> "T5Config":
    ff = hf.get("feed_forward_proj", "relu")
    ff = {"gated-gelu_new": "gated-gelu"}.get(ff, ff)
    if ff not in FEED_FORWARD:
      raise NotImplementedError(f"config.json feed_forward_proj={hf.get('feed_forward_proj')!r}; supported: "
                                f"{FEED_FORWARD}")
    return cls(**{**dict(
        vocab_size=hf["vocab_size"], d_model=hf.get("d_model", 512), d_kv=hf.get("d_kv", 64),
        d_ff=hf.get("d_ff", 2048), num_layers=hf.get("num_layers", 6),
        num_decoder_layers=hf.get("num_decoder_layers") or hf.get("num_layers", 6), num_heads=hf.get("num_heads", 8),
        relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=hf.get("relative_attention_max_distance", 128), feed_forward=ff,
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-6), tie_word_embeddings=hf.get("tie_word_embeddings", True),
        pad_token_id=hf.get("pad_token_id", 0), eos_token_id=hf.get("eos_token_id", 1),
        decoder_start_token_id=hf.get("decoder_start_token_id", 0)), **overrides})

  def to_hf(self) -> dict:
    return dict(architectures=["T5ForConditionalGeneration"], model_type="t5", vocab_size=self.vocab_size,
                d_model=self.d_model, d_kv=self.d_kv, d_ff=self.d_ff, num_layers=self.num_layers,
                num_decoder_layers=self.num_decoder_layers, num_heads=self.num_heads,
                relative_attention_num_buckets=self.relative_attention_num_buckets,
                relative_attention_max_distance=self.relative_attention_max_distance,
                feed_forward_proj=self.feed_forward, layer_norm_epsilon=self.layer_norm_eps,
                tie_word_embeddings=self.tie_word_embeddings, pad_token_id=self.pad_token_id,
                eos_token_id=self.eos_token_id, decoder_start_token_id=self.decoder_start_token_id,
                is_encoder_decoder=True, dropout_rate=0.0, dtype=self.param_dtype)


def relative_buckets(relative: jax.Array, bidirectional: bool, num_buckets: int, max_distance: int) -> jax.Array:
  """HF `T5Attention._relative_position_bucket`: exact buckets for small distances, log-spaced up to
  `max_distance`; the encoder's halves for keys before and after the query."""
  buckets = jnp.zeros_like(relative)
  if bidirectional:
    num_buckets //= 2
    buckets += (relative > 0).astype(relative.dtype) * num_buckets
    relative = jnp.abs(relative)
  else:
    relative = -jnp.minimum(relative, 0)
  max_exact = num_buckets // 2
  is_small = relative < max_exact
  large = max_exact + (jnp.log(jnp.maximum(relative, 1).astype(jnp.float32) / max_exact)
                       / math.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(relative.dtype)
  large = jnp.minimum(large, num_buckets - 1)
  return buckets + jnp.where(is_small, relative, large)


class Attention(nnx.Module):

  def __init__(self, cfg: T5Config, *, relative_bias: bool, bidirectional: bool, rngs: nnx.Rngs):
    dt, pdt = llama.as_dtype(cfg.dtype), llama.as_dtype(cfg.param_dtype)
    e, h, d = cfg.d_model, cfg.num_heads, cfg.d_kv
    proj = lambda: layers.Dense(e, (h, d), in_axes=("embed",), out_axes=("heads", "head_dim"), dtype=dt,
                                param_dtype=pdt, rngs=rngs)
    self.q, self.k, self.v = proj(), proj(), proj()
    self.o = layers.Dense((h, d), e, in_axes=("heads", "head_dim"), out_axes=("embed",), dtype=dt, param_dtype=pdt,
                          rngs=rngs)
    self.cfg, self.bidirectional = cfg, bidirectional
    self.relative_attention_bias = (
        nnx.Param(layers.normal_init(1.0)(rngs.params(), (cfg.relative_attention_num_buckets, h), pdt),
                  logical_axes=(None, "heads")) if relative_bias else None)

  def position_bias(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """[1, H, Tq, Tk] from query and key positions [Tq], [Tk]."""
    cfg = self.cfg
    buckets = relative_buckets(k_pos[None, :] - q_pos[:, None], self.bidirectional,
                               cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance)
    table = self.relative_attention_bias.get_value().astype(jnp.float32)
    return jnp.take(table, buckets, axis=0).transpose(2, 0, 1)[None]

  def __call__(self, x, kv_in, bias, mask, cache=None):
    """x [B,T,E] queries; kv_in [B,S,E] (None: `cache` holds (k, v) already); bias [1|B,H,T,S]; mask [B,1,T,S]."""
    q = self.q(x)
    k, v = (self.k(kv_in), self.v(kv_in)) if cache is None else cache
    scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) + bias
    scores = jnp.where(mask, scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return self.o(jnp.einsum("bhts,bshd->bthd", probs, v)), (k, v)


class FeedForward(nnx.Module):

  def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs):
    dt, pdt = llama.as_dtype(cfg.dtype), llama.as_dtype(cfg.param_dtype)
    dense = lambda i, o, ia, oa: layers.Dense(i, o, in_axes=ia, out_axes=oa, dtype=dt, param_dtype=pdt, rngs=rngs)
    self.gated = cfg.feed_forward.startswith("gated")
    if self.gated:
      self.wi_0 = dense(cfg.d_model, cfg.d_ff, ("embed",), ("mlp",))
      self.wi_1 = dense(cfg.d_model, cfg.d_ff, ("embed",), ("mlp",))
    else:
      self.wi = dense(cfg.d_model, cfg.d_ff, ("embed",), ("mlp",))
    self.wo = dense(cfg.d_ff, cfg.d_model, ("mlp",), ("embed",))
    self.act = {"relu": jax.nn.relu, "gated-gelu": lambda x: jax.nn.gelu(x, approximate=True),
                "gated-silu": jax.nn.silu}[cfg.feed_forward]

  def __call__(self, x):
    h = self.act(self.wi_0(x)) * self.wi_1(x) if self.gated else self.act(self.wi(x))
    return self.wo(h)


def _norm(cfg: T5Config) -> layers.RMSNorm:
  return layers.RMSNorm(cfg.d_model, eps=cfg.layer_norm_eps, dtype=llama.as_dtype(cfg.dtype),
                        param_dtype=llama.as_dtype(cfg.param_dtype))


class Block(nnx.Module):
  """Self-attention (+ cross-attention in the decoder) + feed-forward, each pre-norm with a residual."""

  def __init__(self, cfg: T5Config, *, decoder: bool, first: bool, rngs: nnx.Rngs):
    self.self_norm = _norm(cfg)
    self.self_attn = Attention(cfg, relative_bias=first, bidirectional=not decoder, rngs=rngs)
    self.cross_norm = _norm(cfg) if decoder else None
    self.cross_attn = Attention(cfg, relative_bias=False, bidirectional=True, rngs=rngs) if decoder else None
    self.ff_norm = _norm(cfg)
    self.ff = FeedForward(cfg, rngs=rngs)


class Stack(nnx.Module):
  """The encoder or the decoder: blocks, then a final norm."""

  def __init__(self, cfg: T5Config, *, decoder: bool, rngs: nnx.Rngs):
    n = cfg.num_decoder_layers if decoder else cfg.num_layers
    self.blocks = nnx.List([Block(cfg, decoder=decoder, first=i == 0, rngs=rngs) for i in range(n)])
    self.final_norm = _norm(cfg)


class T5(nnx.Module):
  """`encode(ids, mask)` -> [B, S, E]; `decode(ids, memory, memory_mask)` -> logits [B, T, V] (float32)."""

  def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs):
    self.config = cfg
    dt, pdt = llama.as_dtype(cfg.dtype), llama.as_dtype(cfg.param_dtype)
    self.shared = layers.Embed(cfg.vocab_size, cfg.d_model, dtype=dt, param_dtype=pdt, rngs=rngs)
    self.encoder = Stack(cfg, decoder=False, rngs=rngs)
    self.decoder = Stack(cfg, decoder=True, rngs=rngs)
    self.lm_head = (None if cfg.tie_word_embeddings else
                    layers.Dense(cfg.d_model, cfg.vocab_size, in_axes=("embed",), out_axes=("vocab",), dtype=dt,
                                 param_dtype=pdt, rngs=rngs))

  def encode(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    x = self.shared(input_ids)
    blocks = list(self.encoder.blocks)
    pos = jnp.arange(input_ids.shape[1])
    bias = blocks[0].self_attn.position_bias(pos, pos)
    mask = attention_mask.astype(bool)[:, None, None, :]
    for b in blocks:
      x = x + b.self_attn(b.self_norm(x), b.self_norm(x), bias, mask)[0]
      x = x + b.ff(b.ff_norm(x))
    return self.encoder.final_norm(x)

  def decode(self, decoder_ids: jax.Array, memory: jax.Array, memory_mask: jax.Array,
             return_hidden: bool = False) -> jax.Array:
    """Teacher-forced decoding of `decoder_ids` (starting with the decoder start token) over `memory`."""
    t = decoder_ids.shape[1]
    pos = jnp.arange(t)
    causal = (pos[None, :] <= pos[:, None])[None, None]
    cross_mask = memory_mask.astype(bool)[:, None, None, :]
    return self._decode(self.shared(decoder_ids), pos, causal, memory, cross_mask, None, return_hidden)[0]

  def _decode(self, x, q_pos, self_mask, memory, cross_mask, caches, return_hidden):
    """Shared by teacher forcing (caches None) and cached steps (caches: per block ((k, v) self, (k, v) cross))."""
    blocks = list(self.decoder.blocks)
    k_len = self_mask.shape[-1]
    bias = blocks[0].self_attn.position_bias(q_pos, jnp.arange(k_len))
    new = []
    for i, b in enumerate(blocks):
      h = b.self_norm(x)
      if caches is None:
        a, _ = b.self_attn(h, h, bias, self_mask)
        x = x + a
        x = x + b.cross_attn(b.cross_norm(x), memory, 0.0, cross_mask)[0]
      else:
        (k_c, v_c), cross = caches[i]
        k_new, v_new = b.self_attn.k(h), b.self_attn.v(h)
        at = q_pos[0]
        k_c = jax.lax.dynamic_update_slice_in_dim(k_c, k_new.astype(k_c.dtype), at, axis=1)
        v_c = jax.lax.dynamic_update_slice_in_dim(v_c, v_new.astype(v_c.dtype), at, axis=1)
        a, _ = b.self_attn(h, None, bias, self_mask, cache=(k_c, v_c))
        x = x + a
        x = x + b.cross_attn(b.cross_norm(x), None, 0.0, cross_mask, cache=cross)[0]
        new.append(((k_c, v_c), cross))
      x = x + b.ff(b.ff_norm(x))
    x = self.decoder.final_norm(x)
    if return_hidden:
      return x, new
    return self.logits(x), new

  def logits(self, hidden: jax.Array) -> jax.Array:
    cfg = self.config
    if cfg.tie_word_embeddings:
      return self.shared.attend(hidden * cfg.d_model ** -0.5).astype(jnp.float32)
    return self.lm_head(hidden).astype(jnp.float32)


def generate(model: T5, memory: jax.Array, memory_mask: jax.Array, max_new_tokens: int, *, temperature: float = 0.0,
             rng: jax.Array | None = None, eos_id: int | None = None) -> jax.Array:
  """Tokens [B, max_new_tokens] decoded from the start token over `memory` with a KV cache (greedy at
  temperature 0, else sampled); after an `eos_id` a row repeats the pad token, as HF's `generate` pads."""
  cfg = model.config
  b = memory.shape[0]
  blocks = list(model.decoder.blocks)
  cross_mask = memory_mask.astype(bool)[:, None, None, :]
  caches = []
  for blk in blocks:
    zeros = jnp.zeros((b, max_new_tokens, cfg.num_heads, cfg.d_kv), memory.dtype)
    caches.append(((zeros, zeros), (blk.cross_attn.k(memory), blk.cross_attn.v(memory))))
  slots = jnp.arange(max_new_tokens)
  tok = jnp.full((b,), cfg.decoder_start_token_id, jnp.int32)
  done = jnp.zeros((b,), bool)
  rng = jax.random.key(0) if rng is None else rng
  out = []
  for t in range(max_new_tokens):
    self_mask = (slots <= t)[None, None, None, :]
    logits, caches = model._decode(model.shared(tok[:, None]), jnp.asarray([t]), self_mask, memory, cross_mask,
                                   caches, False)
    logits = logits[:, -1]
    if temperature > 0:
      rng, key = jax.random.split(rng)
      nxt = jax.random.categorical(key, logits / temperature).astype(jnp.int32)
    else:
      nxt = jnp.argmax(logits, -1).astype(jnp.int32)
    nxt = jnp.where(done, cfg.pad_token_id, nxt)
    if eos_id is not None:
      done = done | (nxt == eos_id)
    out.append(nxt)
    tok = nxt
  return jnp.stack(out, axis=1)
