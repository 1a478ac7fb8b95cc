"""AutoUI, the actor of DigiRL and Digi-Q: T5 whose encoder output is fused with one screenshot feature vector.

DigiRL's `T5ForMultimodalGeneration` (`digirl/models/model.py`): the screenshot's pooled BLIP-2 feature (1408
numbers, `img_dim`) goes through `image_dense` to d_model; a one-head `nn.MultiheadAttention` (`mha_layer`) lets
every encoder state attend over it; a sigmoid gate (`gate_dense` on [state; attended]) mixes the two,
h = (1 - g) * h + g * attended, and the decoder cross-attends to the mixed states. With one image vector the
attention's softmax is over a single key, so `attended` is out_proj(v_proj(image)) at every position — kept as
the original computes it.

`ScreenAutoUI` is what `config.model.kind="autoui"` builds: AutoUI over a frozen ViT standing in for BLIP-2, so
batches and prompts carry pixels; `t5_init` draws a from-scratch T5 as HF does.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent.models import layers, llama, t5, vit


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


class FrozenImageEncoder(nnx.Module):
  """The frozen BLIP-2 stand-in: DigiRL feeds AutoUI the pooled feature of a frozen BLIP-2 ViT-g; here a ViT tower
  (`models.vit`) whose patch features are mean-pooled. Outputs sit under `stop_gradient`, and
  `ScreenAutoUI.TRAINABLE` keeps the optimizer off these weights, so training moves AutoUI alone."""

  def __init__(self, cfg: vit.ViTConfig, *, rngs: nnx.Rngs):
    self.tower = vit.VisionTower(cfg, rngs=rngs)

  def patches(self, images: jax.Array) -> jax.Array:
    """[N, S, S, 3] normalised images -> [N, P, width] patch features (no gradient)."""
    return jax.lax.stop_gradient(self.tower(images))

  def __call__(self, images: jax.Array) -> jax.Array:
    """[N, S, S, 3] -> [N, width]: the pooled feature AutoUI's `image_dense` reads."""
    return jnp.mean(self.patches(images), axis=1)


class ScreenAutoUI(nnx.Module):
  """AutoUI over raw screenshots: the frozen image encoder's pooled feature is the `image_features` input, so a
  batch carries pixels (`config.model.kind="autoui"`, built by `models.build`)."""

  # What the optimizer trains: every parameter but the frozen encoder's.
  TRAINABLE = nnx.All(nnx.Param, nnx.Not(nnx.PathContains("image_encoder")))

  def __init__(self, cfg: AutoUIConfig, vision: vit.ViTConfig, *, rngs: nnx.Rngs):
    if vision.width != cfg.img_dim:
      raise ValueError(f"the image encoder's width {vision.width} is not AutoUI's img_dim {cfg.img_dim}; set "
                       f"--config.model.vision.width={cfg.img_dim}")
    self.image_encoder = FrozenImageEncoder(vision, rngs=rngs)
    self.autoui = AutoUI(cfg, rngs=rngs)

  @property
  def config(self) -> AutoUIConfig:
    return self.autoui.config

  def image_features(self, images: jax.Array) -> jax.Array:
    """[N, P, width] the frozen encoder's patch features (what `pipeline.device.screen_features` pools)."""
    return self.image_encoder.patches(images)

  def __call__(self, input_ids, attention_mask, images, decoder_ids):
    """Teacher-forced logits [B, T, V] of `decoder_ids` given the prompt ids [B, S] and one screenshot per row
    [B, H, W, 3]."""
    return self.autoui(input_ids, attention_mask, self.image_encoder(images), decoder_ids)

  def generate(self, input_ids, attention_mask, images, max_new_tokens: int, *, temperature: float = 0.0,
               rng=None, eos_id: int | None = None) -> jax.Array:
    return self.autoui.generate(input_ids, attention_mask, self.image_encoder(images), max_new_tokens,
                                temperature=temperature, rng=rng, eos_id=eos_id)


def t5_init(model: t5.T5, seed: int = 0) -> None:
  """Redraws `model`'s weights as HF's `T5PreTrainedModel._init_weights` draws them: embeddings N(0, 1), q
  N(0, (d_model·d_kv)^-½), k and v N(0, d_model^-½), o N(0, (heads·d_kv)^-½), wi N(0, d_model^-½), wo
  N(0, d_ff^-½). T5 has no 1/√d in attention and scales tied logits by d_model^-½, so the generic N(0, 0.02)
  leaves a from-scratch T5 with near-uniform logits that train slowly."""
  cfg = model.config
  e, h, d = cfg.d_model, cfg.num_heads, cfg.d_kv
  stds = {"embedding": 1.0, "relative_attention_bias": e ** -0.5, "q": (e * d) ** -0.5, "k": e ** -0.5,
          "v": e ** -0.5, "o": (h * d) ** -0.5, "wi": e ** -0.5, "wi_0": e ** -0.5, "wi_1": e ** -0.5,
          "wo": cfg.d_ff ** -0.5, "lm_head": e ** -0.5}
  key = jax.random.key(seed)
  for i, (path, var) in enumerate(nnx.iter_graph(model)):
    if not isinstance(var, nnx.Param):
      continue
    name = path[-2] if path[-1] == "kernel" else path[-1]
    if name in stds:
      value = var.get_value()
      var.set_value(stds[name] * jax.random.normal(jax.random.fold_in(key, i), value.shape, value.dtype))


def init_screen_autoui(cfg: AutoUIConfig, vision: vit.ViTConfig, seed: int = 0) -> ScreenAutoUI:
  """A from-scratch AutoUI (T5 drawn as `t5_init`) over a seeded frozen encoder."""
  model = ScreenAutoUI(cfg, vision, rngs=nnx.Rngs(seed))
  t5_init(model.autoui.t5, seed)
  return model
