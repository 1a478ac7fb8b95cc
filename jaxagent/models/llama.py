"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2) as one Flax NNX module selected by `DecoderConfig`.

Differences between the families are flags, not subclasses: Llama-3 RoPE scaling (`rope_scaling`), Qwen2's
q/k/v biases (`attention_bias`), Mistral's sliding window (`sliding_window`), tied embeddings.

Parameter names mirror Hugging Face (`layers[i].self_attn.q_proj.kernel`, ...) so that the mapping table in
`models/hf/llama.py` reads line by line against the checkpoint. Kernels are stored `[in..., out...]` with
heads as their own axis (`q_proj.kernel: [embed, heads, head_dim]`).

The KV cache (`KVCache`) is a pytree of preallocated per-layer `[B, L_max, kv_heads, head_dim]` buffers plus
per-slot validity and RoPE positions and one write index shared by all rows. A forward pass with a cache
writes its T tokens at slots `[index, index+T)` for every row (padding tokens are written but marked
invalid) and attends over the whole buffer under the mask `slot causal & valid & window`. Rows therefore
may have different prompt lengths and either padding side; a row's next RoPE position is the number of
valid tokens it holds (`cache.lengths`). A prompt written into a cache nothing was written to yet (`KVCache.empty`,
as `init_cache` makes it: a prefill) attends within itself instead, through the self-attention paths that skip
the blocks above the diagonal (`layers.causal_block_attention`, `flash_attention`): the same keys carry weight,
and the [T, L] scores over the empty slots are never computed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent import sharding
from jaxagent.models import layers

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def as_dtype(d) -> Any:
  if isinstance(d, str):
    if d not in _DTYPES:
      raise ValueError(f"dtype {d!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[d]
  return d


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """Hyper-parameters of a Llama-family decoder; `from_hf`/`to_hf` translate HF `config.json` dicts."""
  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  rope_theta: float = 10000.0
  rope_scaling: dict | None = None  # None or HF rope parameters, e.g. {"rope_type": "llama3", "factor": 8, ...}
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  attention_bias: bool = False  # q/k/v biases (Qwen2; Llama with attention_bias=True)
  attention_out_bias: bool = False  # o_proj bias (Llama with attention_bias=True only)
  sliding_window: int | None = None  # Mistral: a key is visible when q_pos - k_pos < sliding_window
  max_position_embeddings: int = 4096
  dtype: str = "float32"  # compute dtype
  param_dtype: str = "float32"
  remat: str | bool = "none"  # what each block's backward keeps: `layers.REMAT_POLICIES`
  attention: str = "xla"  # the uncached forward's attention kernel: `layers.ATTENTION_IMPLS`
  model_type: str = "llama"  # llama | mistral | qwen2: the HF architecture `to_hf` writes
  bos_token_id: int | None = None
  eos_token_id: int | list[int] | None = None
  pad_token_id: int | None = None
  # A pointer over the input's tokens mixed into the output by a gate (`CopyHead`; a named departure of the
  # project's own base, docs/results/pretrain.md#copy-head): its query/key width, 0 = none; the K keys it keeps.
  copy_head: int = 0
  copy_top_k: int = 32

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"DecoderConfig.num_heads={self.num_heads} must be a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"DecoderConfig.head_dim={self.head_dim} must be even for RoPE")
    if self.model_type not in _ARCHITECTURES:
      raise ValueError(f"DecoderConfig.model_type={self.model_type!r}; use one of {sorted(_ARCHITECTURES)}")
    as_dtype(self.dtype), as_dtype(self.param_dtype)
    if self.copy_head < 0 or self.copy_top_k < 1:
      raise ValueError(f"DecoderConfig.copy_head={self.copy_head} must be >= 0 (0: none) and copy_top_k="
                       f"{self.copy_top_k} >= 1")
    if self.attention not in layers.ATTENTION_IMPLS:
      raise ValueError(f"DecoderConfig.attention={self.attention!r} is not one of {layers.ATTENTION_IMPLS}")
    if self.attention == "cudnn" and self.dtype not in ("bfloat16", "float16"):
      raise ValueError(f"DecoderConfig.attention='cudnn' runs in bfloat16 or float16, but dtype={self.dtype!r}")

  @classmethod
  def tiny(cls, **overrides) -> "DecoderConfig":
    """A 2-layer model with GQA, small enough for unit tests on one CPU core."""
    base = dict(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                intermediate_size=128, max_position_embeddings=512)
    base.update(overrides)
    return cls(**base)

  def replace(self, **changes) -> "DecoderConfig":
    return dataclasses.replace(self, **changes)

  @property
  def num_params(self) -> int:
    e, h, k, d, f, v = (self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                        self.intermediate_size, self.vocab_size)
    per_layer = e * d * (2 * h + 2 * k) + 3 * e * f + 2 * e
    if self.attention_bias:
      per_layer += d * (h + 2 * k)
    copy = 2 * e * self.copy_head + e + 1 if self.copy_head else 0
    return self.num_layers * per_layer + v * e * (1 if self.tie_word_embeddings else 2) + e + copy

  @classmethod
  def from_hf(cls, hf: dict, **overrides) -> "DecoderConfig":
    """From a HF `config.json` dict of LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM."""
    model_type = hf.get("model_type", "llama")
    if model_type not in _ARCHITECTURES:
      raise ValueError(f"config.json model_type={model_type!r} is not a Llama-family decoder; "
                       f"supported: {sorted(_ARCHITECTURES)}")
    if hf.get("hidden_act", "silu") != "silu":
      raise NotImplementedError(f"config.json hidden_act={hf['hidden_act']!r}; only 'silu' (SwiGLU) is supported")
    if hf.get("mlp_bias"):
      raise NotImplementedError("config.json mlp_bias=true is not supported")
    rope = dict(hf.get("rope_parameters") or {})
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if scaling:
      scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
    heads = hf["num_attention_heads"]
    sliding = None
    if model_type == "mistral":
      sliding = hf.get("sliding_window")
    elif model_type == "qwen2" and hf.get("use_sliding_window"):
      types = set(hf.get("layer_types") or ["sliding_attention"])
      if types != {"sliding_attention"}:
        raise NotImplementedError("Qwen2 with sliding window on only some layers (layer_types) is not supported")
      sliding = hf.get("sliding_window")
    bias = bool(hf.get("attention_bias", False)) or model_type == "qwen2"
    fields = dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        intermediate_size=hf["intermediate_size"], rope_theta=float(theta), rope_scaling=scaling or None,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6), tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bias, attention_out_bias=bool(hf.get("attention_bias", False)) and model_type == "llama",
        sliding_window=sliding, max_position_embeddings=hf.get("max_position_embeddings", 4096),
        model_type=model_type, bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"), copy_head=int(hf.get("jaxagent_copy_head", 0)),
        copy_top_k=int(hf.get("jaxagent_copy_top_k", 32)))
    fields.update(overrides)
    return cls(**fields)

  def to_hf(self) -> dict:
    """A `config.json` dict that `transformers.AutoModelForCausalLM` builds the same model from."""
    if self.model_type == "qwen2" and self.attention_bias != True:  # noqa: E712
      raise ValueError("Qwen2 always has q/k/v biases; set attention_bias=True or model_type='llama'")
    if self.model_type != "llama" and self.attention_out_bias:
      raise ValueError(f"{self.model_type} has no o_proj bias; set attention_out_bias=False")
    if self.model_type == "llama" and self.attention_bias != self.attention_out_bias:
      raise ValueError("Llama's attention_bias covers q/k/v/o together; set attention_bias == attention_out_bias "
                       "(or model_type='qwen2' for q/k/v biases only)")
    rope = {"rope_type": "default", "rope_theta": self.rope_theta}
    if self.rope_scaling:
      rope = {**self.rope_scaling, "rope_theta": self.rope_theta}
    hf = dict(
        architectures=[_ARCHITECTURES[self.model_type]], model_type=self.model_type,
        vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=self.num_layers,
        num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim,
        intermediate_size=self.intermediate_size, hidden_act="silu", rms_norm_eps=self.rms_norm_eps,
        max_position_embeddings=self.max_position_embeddings, rope_parameters=rope,
        tie_word_embeddings=self.tie_word_embeddings, bos_token_id=self.bos_token_id,
        eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id, dtype=self.param_dtype)
    if self.model_type == "llama":
      hf["attention_bias"] = self.attention_bias
    elif self.model_type == "mistral":
      hf["sliding_window"] = self.sliding_window
    elif self.model_type == "qwen2":
      hf["use_sliding_window"] = self.sliding_window is not None
      hf["sliding_window"] = self.sliding_window
      hf["max_window_layers"] = 0
      kind = "sliding_attention" if self.sliding_window is not None else "full_attention"
      hf["layer_types"] = [kind] * self.num_layers
    if self.copy_head:  # transformers ignores both keys and the head's weights: it runs the decoder without it
      hf.update(jaxagent_copy_head=self.copy_head, jaxagent_copy_top_k=self.copy_top_k)
    return hf


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  """Preallocated keys/values for every layer (see the module docstring for the protocol).

  k, v: per layer [B, L_max, kv_heads, head_dim]; valid: [B, L_max] bool (slot holds a real token);
  positions: [B, L_max] int32 RoPE positions; index: the next slot to write, [] int32 (the same for all rows)
  or [B] int32 (each row its own, one token per call: the continuous-batching server's decode step);
  pointer [B, L_max, copy_head] and tokens [B, L_max] int32: the copy head's keys and the tokens it copies (None
  without one).
  """
  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  valid: jax.Array
  positions: jax.Array
  index: jax.Array
  pointer: jax.Array | None = None
  tokens: jax.Array | None = None
  # nothing was written to it yet (a fresh `init_cache`): a multi-token call may attend within its own input
  empty: bool = dataclasses.field(default=False, metadata=dict(static=True))

  @property
  def max_len(self) -> int:
    return self.valid.shape[1]

  @property
  def lengths(self) -> jax.Array:
    """Valid tokens per row [B]; also each row's next RoPE position."""
    return jnp.sum(self.valid, axis=1, dtype=jnp.int32)

  def map_slots(self, fn, *others: "KVCache", **changes) -> "KVCache":
    """A cache with `fn(array, *others' same arrays)` for each per-slot array (k, v, valid, positions and the copy
    head's pointer and tokens) and `changes` to the other fields."""
    each = lambda name: fn(getattr(self, name), *(getattr(o, name) for o in others))
    slots = dict(k=tuple(map(fn, self.k, *(o.k for o in others))), v=tuple(map(fn, self.v, *(o.v for o in others))),
                 valid=each("valid"), positions=each("positions"))
    if self.pointer is not None:
      slots.update(pointer=each("pointer"), tokens=each("tokens"))
    return dataclasses.replace(self, **slots, **changes)


def write_slots(cache: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
  """`cache` [B, L, ...] with `new` [B, T, ...] written at slot `index`: one index for every row (a scalar), or
  each row its own ([B], T = 1: the continuous-batching decode step, whose rows joined at different times)."""
  if jnp.ndim(index) == 0:
    return jax.lax.dynamic_update_slice(cache, new, (0, index) + (0,) * (cache.ndim - 2))
  return cache.at[jnp.arange(cache.shape[0]), index].set(new[:, 0])


class Attention(nnx.Module):

  def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
    dt, pdt = as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
    e, h, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    proj = lambda out, axes, bias: layers.Dense(e, out, in_axes=("embed",), out_axes=axes, use_bias=bias,
                                                dtype=dt, param_dtype=pdt, rngs=rngs)
    self.q_proj = proj((h, d), ("heads", "head_dim"), cfg.attention_bias)
    self.k_proj = proj((k, d), ("kv_heads", "head_dim"), cfg.attention_bias)
    self.v_proj = proj((k, d), ("kv_heads", "head_dim"), cfg.attention_bias)
    self.o_proj = layers.Dense((h, d), e, in_axes=("heads", "head_dim"), out_axes=("embed",),
                               use_bias=cfg.attention_out_bias, dtype=dt, param_dtype=pdt, rngs=rngs)
    self.attention = cfg.attention

  def __call__(self, x, positions, inv_freq, mask_fn, kv=None, index=None, within_input=False):
    """x [B,T,E]; kv: this layer's (k_cache, v_cache) or None. Returns (out, new_kv). `within_input`: the cache
    held nothing before this call, so the input attends within itself (mask_fn: its `layers.SelfMask`) and is
    only written to the cache."""
    q = layers.shard_heads(layers.apply_rope(self.q_proj(x), positions, inv_freq))
    k = layers.shard_heads(layers.apply_rope(self.k_proj(x), positions, inv_freq), kv=True)
    v = layers.shard_heads(self.v_proj(x), kv=True)
    if kv is not None:
      k_cache, v_cache = kv
      k, v = k.astype(k_cache.dtype), v.astype(v_cache.dtype)  # as the cache holds them
      kv = (write_slots(k_cache, k, index), write_slots(v_cache, v, index))
      if not within_input:
        k, v = kv
    k, v = k.astype(q.dtype), v.astype(q.dtype)
    if kv is not None and not within_input:  # mask_fn: the [B, 1, T, L] mask over the cache
      attend = layers.dot_product_attention if x.shape[1] == 1 else layers.causal_block_attention
      out = attend(q, k, v, mask_fn())
    elif self.attention == "flash":  # mask_fn: a `layers.SelfMask`, kept as vectors
      out = layers.flash_attention(q, k, v, mask_fn())
    elif self.attention == "xla":
      out = layers.causal_block_attention(q, k, v, mask_fn().dense())
    else:
      out = layers.fused_causal_attention(q, k, v, mask_fn().dense(), self.attention)
    return self.o_proj(layers.shard_heads(out)), kv


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
    dt, pdt = as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
    e, f = cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = layers.Dense(e, f, in_axes=("embed",), out_axes=("mlp",), dtype=dt, param_dtype=pdt, rngs=rngs)
    self.up_proj = layers.Dense(e, f, in_axes=("embed",), out_axes=("mlp",), dtype=dt, param_dtype=pdt, rngs=rngs)
    self.down_proj = layers.Dense(f, e, in_axes=("mlp",), out_axes=("embed",), dtype=dt, param_dtype=pdt, rngs=rngs)

  def __call__(self, x):
    hidden = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)
    return self.down_proj(sharding.shard(hidden, ("batch", "length", "act_mlp")))


class Block(nnx.Module):

  def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
    dt, pdt = as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
    self.input_layernorm = layers.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dt, param_dtype=pdt)
    self.self_attn = Attention(cfg, rngs=rngs)
    self.post_attention_layernorm = layers.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dt,
                                                   param_dtype=pdt)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x, positions, inv_freq, mask_fn, kv=None, index=None, within_input=False):
    attn, kv = self.self_attn(self.input_layernorm(x), positions, inv_freq, mask_fn, kv, index, within_input)
    x = x + attn
    x = x + self.mlp(self.post_attention_layernorm(x))
    return sharding.shard(x, ("batch", "length", "act_embed")), kv


class CopyHead(nnx.Module):
  """A pointer over the input's tokens mixed into the vocabulary's distribution by a gate (pointer-generator, See et
  al. 2017; CopyNet, Gu et al. 2016): p(y) = g p_vocab(y) + (1 - g) sum of the pointer's weights on the keys holding y.
  A small model that must type a string it was shown names the position to copy from instead of recalling the
  string's tokens. A token's key is read off the token *before* it (an induction head by construction): a query
  holding the token just copied finds where that token sits in the source and copies the one after it, up to the
  token that closes the string (keys of a token's own state make the pointer repeat the token it just copied,
  docs/results/pretrain.md#copy-head). A row's first token, with nothing before it, is never copied. The pointer
  keeps its `copy_top_k` largest weights (renormalised), so that what `hidden_states` hands `Decoder.logits` at a
  position is fixed-width: [hidden E | gate 1 | weights K | their tokens K]."""

  def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
    dt, pdt = as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
    e, d = cfg.hidden_size, cfg.copy_head
    dense = lambda out, bias: layers.Dense(e, out, in_axes=("embed",), out_axes=(None,), use_bias=bias, dtype=dt,
                                           param_dtype=pdt, rngs=rngs)
    self.query, self.key, self.gate = dense(d, False), dense(d, False), dense(1, True)
    self.top_k = cfg.copy_top_k

  @staticmethod
  def previous_keys(keys, valid):
    """`keys` [B, S, D] of each slot's own token -> each slot's key: that of the row's previous valid slot (slot 0's
    is its own, which the mask drops)."""
    slots = jnp.arange(keys.shape[1], dtype=jnp.int32)
    latest = jax.lax.cummax(jnp.where(valid, slots, -1), axis=1)
    before = jnp.concatenate([jnp.zeros_like(latest[:, :1]), jnp.maximum(latest[:, :-1], 0)], 1)
    return jnp.take_along_axis(keys, before[..., None], 1)

  def scores(self, hidden, keys, mask, valid, positions):
    """The pointer's logits [B, T, S] of queries `hidden` [B, T, E] over the slots whose own keys are `keys`
    [B, S, D] (`valid`, RoPE `positions` [B, S]) under `mask` [B, T, S]; a slot at position 0 has no token before
    it and is masked."""
    q = self.query(hidden)
    keys = self.previous_keys(keys, valid)
    s = jnp.einsum("btd,bsd->bts", q, keys.astype(q.dtype)).astype(jnp.float32) / jnp.sqrt(q.shape[-1])
    return jnp.where(mask & (positions > 0)[:, None, :], s, -1e9)

  def __call__(self, hidden, keys, tokens, mask, valid, positions):
    """`hidden` [B, T, E] widened to [B, T, E + 1 + 2K] (see the class docstring) over `keys`/`tokens` [B, S]."""
    s = self.scores(hidden, keys, mask, valid, positions)
    k = min(self.top_k, s.shape[-1])
    top, at = jax.lax.top_k(s, k)
    live = top > -1e8  # a masked key holds no weight; a query with none (a row's first token) takes the vocabulary
    weights = jnp.where(live, jax.nn.softmax(top, -1), 0.0)
    picked = tokens[jnp.arange(tokens.shape[0])[:, None, None], at].astype(jnp.float32)
    pad = [(0, 0), (0, 0), (0, self.top_k - k)]
    gate = jnp.where(live[..., :1], self.gate(hidden).astype(jnp.float32), 1e4)
    return jnp.concatenate([hidden.astype(jnp.float32), gate, jnp.pad(weights, pad),
                            jax.lax.stop_gradient(jnp.pad(picked, pad))], -1)


class Decoder(nnx.Module):
  """Llama-family causal LM.

  `__call__(input_ids | inputs_embeds, positions, attention_mask, cache)` returns logits [B,T,V] (float32),
  `(logits, hidden)` with `return_hidden=True`, and the updated cache appended when one is passed.
  `hidden` is the final-norm output that `lm_head` reads (what value heads pool).
  """

  def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    dt, pdt = as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
    self.embed_tokens = layers.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dt, param_dtype=pdt, rngs=rngs)
    self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.norm = layers.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dt, param_dtype=pdt)
    self.lm_head = None if cfg.tie_word_embeddings else layers.Dense(
        cfg.hidden_size, cfg.vocab_size, in_axes=("embed",), out_axes=("vocab",), dtype=dt, param_dtype=pdt,
        rngs=rngs)
    self.copy_head = CopyHead(cfg, rngs=rngs) if cfg.copy_head else None

  # -- pieces the sampler and the VLM call directly ---------------------------------------------------

  def embed(self, input_ids: jax.Array) -> jax.Array:
    return sharding.shard(self.embed_tokens(input_ids), ("batch", "length", "act_embed"))

  def logits(self, hidden: jax.Array) -> jax.Array:
    """Output projection of final hidden states [..., E] -> float32 logits [..., V]; with a copy head, of what
    `hidden_states` returns ([..., E + 1 + 2K]) -> the mixture's log-probabilities [..., V]."""
    e = self.config.hidden_size
    if hidden.shape[-1] == e:
      return self._vocab_logits(hidden)
    k = self.config.copy_top_k
    gate, weights = hidden[..., e], hidden[..., e + 1:e + 1 + k]
    tokens = hidden[..., e + 1 + k:].astype(jnp.int32)
    vocab = jax.nn.log_softmax(self._vocab_logits(self.features(hidden)), -1)
    lead = weights.shape[:-1]
    rows = jnp.arange(weights.size // k)[:, None]
    copy = jnp.zeros((rows.shape[0], vocab.shape[-1]), jnp.float32).at[rows, tokens.reshape(-1, k)].add(
        weights.reshape(-1, k)).reshape(lead + vocab.shape[-1:])
    return jnp.logaddexp(jax.nn.log_sigmoid(gate)[..., None] + vocab,
                         jax.nn.log_sigmoid(-gate)[..., None] + jnp.log(jnp.maximum(copy, 1e-30)))

  def features(self, hidden: jax.Array) -> jax.Array:
    """The final-norm hidden states [..., E] of what `hidden_states` returns (what value heads pool)."""
    return hidden[..., :self.config.hidden_size].astype(as_dtype(self.config.dtype))

  def _vocab_logits(self, hidden: jax.Array) -> jax.Array:
    if self.lm_head is None:
      out = self.embed_tokens.attend(hidden)
    else:
      out = layers.logits_2d(hidden, self.lm_head.kernel.get_value().astype(hidden.dtype))
    if out.ndim == 3:
      out = sharding.shard(out, ("batch", "length", "act_vocab"))
    return out.astype(jnp.float32)

  def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
    cfg = self.config
    dtype = as_dtype(dtype or cfg.dtype)
    shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
    pointer = tokens = None
    if cfg.copy_head:
      pointer, tokens = jnp.zeros((batch, max_len, cfg.copy_head), dtype), jnp.zeros((batch, max_len), jnp.int32)
    return KVCache(k=zeros(), v=zeros(), valid=jnp.zeros((batch, max_len), bool),
                   positions=jnp.zeros((batch, max_len), jnp.int32), index=jnp.zeros((), jnp.int32),
                   pointer=pointer, tokens=tokens, empty=True)

  def hidden_states(self, input_ids=None, *, inputs_embeds=None, positions=None, attention_mask=None,
                    cache: KVCache | None = None, segment_ids=None, layer_inputs: list | None = None):
    """Final-norm hidden states [B,T,E] and the updated cache (None without one); with a copy head, each widened
    by its pointer ([B, T, E + 1 + 2K], `CopyHead`), which `logits` reads and `features` takes apart.

    `segment_ids` [B,T] (no cache): packed rows, several samples side by side (`data.packing`); a token attends
    only within its own segment, positions restart at each segment, and id 0 is padding. `layer_inputs`: a list
    that receives each block's input [B,T,E] (what a loss on one head's attention reads, `proj.pretrain.targets`)."""
    cfg = self.config
    if (input_ids is None) == (inputs_embeds is None):
      raise ValueError("Decoder: pass exactly one of input_ids or inputs_embeds")
    if cfg.copy_head and input_ids is None:
      raise ValueError("Decoder: a copy head (DecoderConfig.copy_head) copies input tokens; pass input_ids")
    x = self.embed(input_ids) if inputs_embeds is None else sharding.shard(
        inputs_embeds.astype(as_dtype(cfg.dtype)), ("batch", "length", "act_embed"))
    b, t = x.shape[:2]
    if segment_ids is not None:
      if cache is not None or attention_mask is not None:
        raise ValueError("Decoder: segment_ids (packed rows) take no cache and no attention_mask")
      attention_mask = segment_ids > 0
      if positions is None:
        positions = layers.segment_positions(segment_ids)
    mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
    if positions is None:  # the i-th valid token of a row gets position (cached tokens) + i
      start = 0 if cache is None else cache.lengths[:, None]
      positions = start + jnp.cumsum(mask, axis=1, dtype=jnp.int32) - mask.astype(jnp.int32)
    positions = positions.astype(jnp.int32)
    inv_freq = layers.rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    q_slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    within_input = cache is not None and cache.empty and t > 1  # a prefill: its keys are its own

    if cache is None or within_input:
      mask_fn = lambda: layers.SelfMask(mask, positions, segment_ids, cfg.sliding_window)
    if cache is None:
      index = None
    else:
      index = cache.index
      if jnp.ndim(index) and t != 1:
        raise ValueError(f"a per-row cache index writes one token per row; got {t}")
      valid = write_slots(cache.valid, mask, index)
      k_pos = write_slots(cache.positions, positions, index)
      k_slots = jnp.broadcast_to(jnp.arange(cache.max_len, dtype=jnp.int32), valid.shape)
      q_at = q_slots + (index[:, None] if jnp.ndim(index) else index)
      if not within_input:
        mask_fn = lambda: layers.attention_mask(q_at, k_slots, valid, positions, k_pos, cfg.sliding_window)

    new_k, new_v = [], []
    for i, block in enumerate(self.layers):
      kv = None if cache is None else (cache.k[i], cache.v[i])
      if layer_inputs is not None:
        layer_inputs.append(x)
      if layers.remat_name(cfg.remat) != "none" and cache is None:
        x, _ = layers.remat(lambda blk, h, p: blk(h, p, inv_freq, mask_fn), cfg.remat)(block, x, positions)
      else:
        x, kv = block(x, positions, inv_freq, mask_fn, kv, index, within_input)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])
    hidden = self.norm(x)
    pointer = cached = None
    if self.copy_head is not None:  # over the cache once this call's keys and tokens are written, or over its own
      keys, tokens = self.copy_head.key(hidden), input_ids.astype(jnp.int32)
      if cache is not None:
        keys = keys.astype(cache.pointer.dtype)
        pointer, cached = write_slots(cache.pointer, keys, index), write_slots(cache.tokens, tokens, index)
      if cache is not None and not within_input:
        hidden = self.copy_head(hidden, pointer, cached, mask_fn()[:, 0], valid, k_pos)
      else:
        hidden = self.copy_head(hidden, keys, tokens, mask_fn().dense()[:, 0], mask, positions)
    if cache is not None:
      cache = KVCache(k=tuple(new_k), v=tuple(new_v), valid=valid, positions=k_pos, index=index + t,
                      pointer=pointer, tokens=cached)
    return hidden, cache

  def __call__(self, input_ids=None, *, inputs_embeds=None, positions=None, attention_mask=None,
               cache: KVCache | None = None, return_hidden: bool = False, segment_ids=None):
    hidden, new_cache = self.hidden_states(input_ids, inputs_embeds=inputs_embeds, positions=positions,
                                           attention_mask=attention_mask, cache=cache, segment_ids=segment_ids)
    logits = self.logits(hidden)
    out = (logits, self.features(hidden)) if return_hidden else (logits,)
    if cache is not None:
      out = out + (new_cache,)
    return out[0] if len(out) == 1 else out


def init_decoder(cfg: DecoderConfig, seed: int = 0) -> Decoder:
  return Decoder(cfg, rngs=nnx.Rngs(seed))
