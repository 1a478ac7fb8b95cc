"""AutoUI, the actor of DigiRL and Digi-Q: T5 whose encoder output is fused with one screenshot feature vector.

DigiRL's `T5ForMultimodalGeneration` (`digirl/models/model.py`): the screenshot's pooled BLIP-2 feature (1408
numbers, `img_dim`) goes through `image_dense` to d_model; a one-head `nn.MultiheadAttention` (`mha_layer`) lets
every encoder state attend over it; a sigmoid gate (`gate_dense` on [state; attended]) mixes the two,
h = (1 - g) * h + g * attended, and the decoder cross-attends to the mixed states. With one image vector the
attention's softmax is over a single key, so `attended` is out_proj(v_proj(image)) at every position — kept as
the original computes it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent.models import layers, llama, t5


@dataclasses.dataclass(frozen=True)
class AutoUIConfig:
  text: t5.T5Config
  img_dim: int = 1408  # BLIP-2 ViT-g's pooled feature


class AutoUI(nnx.Module):
  """`encode(ids, mask, image_features)` -> fused memory; `__call__` adds teacher-forced decoding -> logits."""

  def __init__(self, cfg: AutoUIConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    tc = cfg.text
    dt, pdt = llama.as_dtype(tc.dtype), llama.as_dtype(tc.param_dtype)
    e = tc.d_model
    dense = lambda i, o, oa: layers.Dense(i, o, in_axes=(None,), out_axes=oa, use_bias=True, dtype=dt,
                                          param_dtype=pdt, rngs=rngs)
    self.t5 = t5.T5(tc, rngs=rngs)
    self.image_dense = dense(cfg.img_dim, e, ("embed",))
    self.mha_in = dense(e, (3, e), (None, "embed"))  # nn.MultiheadAttention's in_proj: q, k, v stacked
    self.mha_out = dense(e, e, ("embed",))
    self.gate_dense = dense(2 * e, e, ("embed",))

  def encode(self, input_ids: jax.Array, attention_mask: jax.Array, image_features: jax.Array) -> jax.Array:
    """input_ids/attention_mask [B, S], image_features [B, img_dim] (or [B, N, img_dim]) -> [B, S, E]."""
    h = self.t5.encode(input_ids, attention_mask)
    image = self.image_dense(image_features.astype(h.dtype))
    if image.ndim == 2:
      image = image[:, None]
    w = self.mha_in.kernel.get_value().astype(h.dtype)
    bias = self.mha_in.bias.get_value().astype(h.dtype)
    q = h @ w[:, 0] + bias[0]
    k, v = image @ w[:, 1] + bias[1], image @ w[:, 2] + bias[2]
    scores = jnp.einsum("bse,bne->bsn", q, k, preferred_element_type=jnp.float32) / jnp.sqrt(q.shape[-1])
    attended = self.mha_out(jnp.einsum("bsn,bne->bse", jax.nn.softmax(scores, -1).astype(v.dtype), v))
    gate = jax.nn.sigmoid(self.gate_dense(jnp.concatenate([h, attended], -1)))
    return (1 - gate) * h + gate * attended

  def __call__(self, input_ids, attention_mask, image_features, decoder_ids, return_hidden: bool = False):
    memory = self.encode(input_ids, attention_mask, image_features)
    return self.t5.decode(decoder_ids, memory, attention_mask, return_hidden=return_hidden)

  def generate(self, input_ids, attention_mask, image_features, max_new_tokens: int, *, temperature: float = 0.0,
               rng=None, eos_id: int | None = None) -> jax.Array:
    memory = self.encode(input_ids, attention_mask, image_features)
    return t5.generate(self.t5, memory, attention_mask, max_new_tokens, temperature=temperature, rng=rng,
                       eos_id=eos_id)


def init_autoui(cfg: AutoUIConfig, seed: int = 0) -> AutoUI:
  return AutoUI(cfg, rngs=nnx.Rngs(seed))
