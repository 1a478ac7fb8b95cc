"""idefics2's connector: a modality projection and a perceiver resampler between SigLIP and Mistral.

OpenWebVoyager's policy is idefics2-8b (`Idefics2ForConditionalGeneration`). Its tower is a SigLIP without the
pooling head whose positions are bucketed onto a fixed grid (`vit.ViTConfig.position_grid`); its decoder is
Mistral (`llama.Decoder`). What is its own is here: every image's patch features go through a SwiGLU projection
to the text width, then `depth` perceiver layers in which `n_latents` learned latents attend over the
concatenation [patch features; latents] (bidirectional, grouped-query heads, no positions), so each image
becomes `n_latents` text-width tokens however many patches it has (HF `Idefics2Connector`).

In the text an image is `<fake_token_around_image>` + `n_latents` x `<image>` + `<fake_token_around_image>`
(the wrapping token is `VLMConfig.image_wrap_token_id`; `data.conversation.expand_images` writes it).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent import sharding
from jaxagent.models import layers, llama

ACTIVATIONS = {"silu": jax.nn.silu, "gelu": lambda x: jax.nn.gelu(x, approximate=False),
               "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


@dataclasses.dataclass(frozen=True)
class PerceiverConfig:
  """HF `Idefics2PerceiverConfig` plus the projection's width (`Idefics2Connector` uses the text MLP's)."""
  n_latents: int = 64
  depth: int = 3
  num_heads: int = 16
  head_dim: int = 96
  num_kv_heads: int = 4
  act: str = "silu"
  rms_norm_eps: float = 1e-6
  projection_dim: int = 14336  # modality projection's hidden width: the text config's intermediate_size
  projection_act: str = "silu"  # the text config's hidden_act

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"PerceiverConfig.num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
    for field in ("act", "projection_act"):
      if getattr(self, field) not in ACTIVATIONS:
        raise ValueError(f"PerceiverConfig.{field}={getattr(self, field)!r} is not one of {sorted(ACTIVATIONS)}")

  @classmethod
  def tiny(cls, text_intermediate: int, **kw) -> "PerceiverConfig":
    return cls(**{"n_latents": 8, "depth": 2, "num_heads": 4, "head_dim": 32, "num_kv_heads": 2,
                  "projection_dim": text_intermediate, **kw})


def _dense(din, dout, in_axes, out_axes, dt, pdt, rngs) -> layers.Dense:
  return layers.Dense(din, dout, in_axes=in_axes, out_axes=out_axes, dtype=dt, param_dtype=pdt, rngs=rngs)


class GatedMLP(nnx.Module):
  """HF `Idefics2MLP`: down(act(gate(x)) * up(x)), no biases, any input and output width."""

  def __init__(self, din: int, hidden: int, dout: int, act: str, dt, pdt, *, in_axis: str, rngs: nnx.Rngs):
    self.gate_proj = _dense(din, hidden, (in_axis,), ("mlp",), dt, pdt, rngs)
    self.up_proj = _dense(din, hidden, (in_axis,), ("mlp",), dt, pdt, rngs)
    self.down_proj = _dense(hidden, dout, ("mlp",), ("embed",), dt, pdt, rngs)
    self.act = ACTIVATIONS[act]

  def __call__(self, x: jax.Array) -> jax.Array:
    h = self.act(self.gate_proj(x)) * self.up_proj(x)
    return self.down_proj(sharding.shard(h, ("batch", "length", "act_mlp")))


class PerceiverAttention(nnx.Module):
  """Latents query [context; latents]; keys and values have `num_kv_heads` heads (GQA), no positions."""

  def __init__(self, cfg: PerceiverConfig, width: int, dt, pdt, *, rngs: nnx.Rngs):
    h, k, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.q_proj = _dense(width, (h, d), ("embed",), ("heads", "head_dim"), dt, pdt, rngs)
    self.k_proj = _dense(width, (k, d), ("embed",), ("kv_heads", "head_dim"), dt, pdt, rngs)
    self.v_proj = _dense(width, (k, d), ("embed",), ("kv_heads", "head_dim"), dt, pdt, rngs)
    self.o_proj = _dense((h, d), width, ("heads", "head_dim"), ("embed",), dt, pdt, rngs)

  def __call__(self, latents: jax.Array, context: jax.Array, mask: jax.Array) -> jax.Array:
    """latents [N, L, E], context [N, P, E], mask [N, 1, L, P + L] -> [N, L, E]."""
    kv_in = jnp.concatenate([context, latents], axis=1)
    out = layers.dot_product_attention(self.q_proj(latents), self.k_proj(kv_in), self.v_proj(kv_in), mask)
    return self.o_proj(out)


class PerceiverLayer(nnx.Module):

  def __init__(self, cfg: PerceiverConfig, width: int, dt, pdt, *, rngs: nnx.Rngs):
    norm = lambda: layers.RMSNorm(width, eps=cfg.rms_norm_eps, dtype=dt, param_dtype=pdt)
    self.input_latents_norm = norm()
    self.input_context_norm = norm()
    self.self_attn = PerceiverAttention(cfg, width, dt, pdt, rngs=rngs)
    self.post_attention_layernorm = norm()
    self.mlp = GatedMLP(width, 4 * width, width, cfg.act, dt, pdt, in_axis="embed", rngs=rngs)

  def __call__(self, latents: jax.Array, context: jax.Array, mask: jax.Array) -> jax.Array:
    latents = latents + self.self_attn(self.input_latents_norm(latents), self.input_context_norm(context), mask)
    return latents + self.mlp(self.post_attention_layernorm(latents))


class Connector(nnx.Module):
  """Patch features [N, P, vision width] -> [N, n_latents, text width] (HF `Idefics2Connector`)."""

  def __init__(self, cfg: PerceiverConfig, vision_width: int, text: llama.DecoderConfig, *, rngs: nnx.Rngs):
    dt, pdt = llama.as_dtype(text.dtype), llama.as_dtype(text.param_dtype)
    e = text.hidden_size
    self.modality_projection = GatedMLP(vision_width, cfg.projection_dim, e, cfg.projection_act, dt, pdt,
                                        in_axis="vision_embed", rngs=rngs)
    self.latents = nnx.Param(jnp.ones((cfg.n_latents, e), pdt), logical_axes=(None, "embed"))
    self.layers = nnx.List([PerceiverLayer(cfg, e, dt, pdt, rngs=rngs) for _ in range(cfg.depth)])
    self.norm = layers.RMSNorm(e, eps=cfg.rms_norm_eps, dtype=dt, param_dtype=pdt)

  def __call__(self, features: jax.Array) -> jax.Array:
    context = self.modality_projection(features)
    n, p, e = context.shape
    latents = jnp.broadcast_to(self.latents.get_value().astype(context.dtype), (n,) + self.latents.get_value().shape)
    mask = jnp.ones((n, 1, latents.shape[1], p + latents.shape[1]), bool)  # every patch is real: no padding
    for layer in self.layers:
      latents = layer(latents, context, mask)
    return self.norm(latents)
