"""The vision-language model: vision tower -> projector -> image features written into the text sequence.

LLaVA's recipe (`LlavaForConditionalGeneration`): the tokenising step expands each `<image>` placeholder into
`config.num_image_tokens` copies of `image_token_id`; the model embeds the text, computes features for all
images of the batch (a flat `[total_images, H, W, 3]` array in order of appearance, row by row), projects
them with `mlp2x_gelu` (Linear -> GELU -> Linear) and writes the k-th image's features over the k-th block
of image-token positions, counting through the batch in row-major order (HF's `masked_scatter`). So a
sample may hold any number of images, and a batch may have rows with none. Trailing images with no image
tokens left are ignored, which lets a data pipeline pad the image array to a fixed count.

Decoding: `VLM` implements the sampler protocol (`init_cache`, `hidden_states`, `logits`, see
`models/sampler.py`); `sample()` below embeds the prompt with its images and hands the merged embeddings
to `sampler.sample`, after which decode steps are text only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import sharding
from jaxagent.models import idefics2, layers, llama, sampler, vit

PROJECTOR_ACTS = {"gelu": lambda x: jax.nn.gelu(x, approximate=False),
                  "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


@dataclasses.dataclass(frozen=True)
class VLMConfig:
  """A vision tower, a Llama-family decoder, and how they meet."""
  vision: vit.ViTConfig
  text: llama.DecoderConfig
  image_token_id: int
  projector_act: str = "gelu"  # HF `projector_hidden_act`; LLaVA-1.5's mlp2x_gelu uses the exact GELU
  projector_bias: bool = True
  perceiver: idefics2.PerceiverConfig | None = None  # set: idefics2's connector instead of LLaVA's projector
  image_wrap_token_id: int | None = None  # idefics2's <fake_token_around_image>, around each image's tokens

  def __post_init__(self):
    if not 0 <= self.image_token_id < self.text.vocab_size:
      raise ValueError(f"VLMConfig.image_token_id={self.image_token_id} must be a token id of the text "
                       f"vocabulary [0, {self.text.vocab_size}); add an image token to the tokenizer")
    if self.image_wrap_token_id is not None and not 0 <= self.image_wrap_token_id < self.text.vocab_size:
      raise ValueError(f"VLMConfig.image_wrap_token_id={self.image_wrap_token_id} is not a token id of the text "
                       f"vocabulary [0, {self.text.vocab_size})")
    if self.projector_act not in PROJECTOR_ACTS:
      raise ValueError(f"VLMConfig.projector_act={self.projector_act!r} is not one of {sorted(PROJECTOR_ACTS)}")

  @property
  def num_image_tokens(self) -> int:
    """How many image-token ids one `<image>` placeholder expands to (its wrapping tokens aside)."""
    return self.perceiver.n_latents if self.perceiver is not None else self.vision.num_features

  @classmethod
  def tiny(cls, vocab_size: int, image_token_id: int | None = None, *, vision: dict | None = None,
           text: dict | None = None, **kw) -> "VLMConfig":
    """The embedded default: 64x64 images (16 image tokens), a 3-block CLIP tower read at block 2 as LLaVA
    does (`select_layer=-2`), a 2-layer decoder of width 128. The tokenizer decides `vocab_size`; the image
    token defaults to its last id."""
    vision_cfg = vit.ViTConfig.tiny("clip", **{"depth": 3, "select_layer": -2, **(vision or {})})
    text_cfg = llama.DecoderConfig.tiny(**{
        "vocab_size": vocab_size, "hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
        "head_dim": 32, "intermediate_size": 256, "max_position_embeddings": 2048, **(text or {})})
    token = vocab_size - 1 if image_token_id is None else image_token_id
    return cls(vision=vision_cfg, text=text_cfg, image_token_id=token, **kw)


class Projector(nnx.Module):
  """LLaVA `mlp2x_gelu`: Linear(vision width -> text width) -> GELU -> Linear(text width -> text width)."""

  def __init__(self, cfg: VLMConfig, *, rngs: nnx.Rngs):
    dt, pdt = llama.as_dtype(cfg.text.dtype), llama.as_dtype(cfg.text.param_dtype)
    ev, et = cfg.vision.width, cfg.text.hidden_size
    self.linear_1 = layers.Dense(ev, et, in_axes=("vision_embed",), out_axes=("mlp",), use_bias=cfg.projector_bias,
                                 dtype=dt, param_dtype=pdt, rngs=rngs)
    self.linear_2 = layers.Dense(et, et, in_axes=("mlp",), out_axes=("embed",), use_bias=cfg.projector_bias,
                                 dtype=dt, param_dtype=pdt, rngs=rngs)
    self.act = PROJECTOR_ACTS[cfg.projector_act]

  def __call__(self, x: jax.Array) -> jax.Array:
    h = self.act(self.linear_1(x))
    h = sharding.shard(h, ("batch", "length", "act_mlp"))
    return self.linear_2(h)


def merge_image_features(text_embeds: jax.Array, input_ids: jax.Array, image_features: jax.Array,
                         image_token_id: int) -> jax.Array:
  """Write image features [I, P, E] over the image-token positions of text embeddings [B, T, E].

  The n-th image-token position of the batch (row-major) takes feature row n of the flattened [I*P, E].
  """
  b, t, e = text_embeds.shape
  flat = image_features.reshape(-1, e).astype(text_embeds.dtype)
  is_image = input_ids == image_token_id
  rank = jnp.cumsum(is_image.reshape(-1), dtype=jnp.int32).reshape(b, t) - 1
  gathered = jnp.take(flat, jnp.clip(rank, 0, flat.shape[0] - 1), axis=0)
  return jnp.where(is_image[..., None], gathered, text_embeds)


def flat_images(images: jax.Array, image_mask: jax.Array) -> jax.Array:
  """[B, M, ...] per-sample image slots → [B*M, ...] with the real images first, in order of appearance.

  `merge_image_features` writes the n-th image over the n-th image-token block of the batch (row-major) and
  ignores trailing images; compacting inside the step keeps per-sample slots in the data, so micro-batches and
  batch sharding split images with their samples. Here, below `data/` and `train/`, because both use it.
  """
  b, m = image_mask.shape
  order = jnp.argsort(~image_mask.reshape(b * m), stable=True)
  return images.reshape(b * m, *images.shape[2:])[order]


def check_image_tokens(input_ids, num_images: int, cfg: VLMConfig) -> None:
  """Host-side check that the image tokens match the images (skipped under tracing, where shapes are all
  we know)."""
  if isinstance(input_ids, jax.core.Tracer):
    return
  n_tokens = int(np.sum(np.asarray(input_ids) == cfg.image_token_id))
  per_image = cfg.num_image_tokens
  if n_tokens % per_image or n_tokens > num_images * per_image:
    raise ValueError(
        f"VLM: the batch has {n_tokens} image tokens (id {cfg.image_token_id}) but {num_images} images of "
        f"{per_image} tokens each; expand every <image> placeholder to exactly {per_image} image tokens and "
        f"pass one image per placeholder, in order of appearance")


class VLM(nnx.Module):
  """LLaVA-style VLM (idefics2 when `cfg.perceiver` is set: its connector is `projector`). `__call__` returns
  float32 logits [B, T, V] (and hidden states / cache like `Decoder`)."""

  def __init__(self, cfg: VLMConfig, *, rngs: nnx.Rngs, vision_tower: vit.VisionTower | None = None,
               decoder: llama.Decoder | None = None):
    """`vision_tower` / `decoder`: parts built elsewhere (e.g. pretrained checkpoints, LLaVA's stage-1 start);
    they must match `cfg`. Whatever is not given is initialised here."""
    self.config = cfg
    if vision_tower is not None and vision_tower.cfg != cfg.vision:
      raise ValueError(f"VLM: vision_tower was built for {vision_tower.cfg}, not VLMConfig.vision={cfg.vision}")
    if decoder is not None and decoder.config != cfg.text:
      raise ValueError(f"VLM: decoder was built for {decoder.config}, not VLMConfig.text={cfg.text}")
    self.vision_tower = vision_tower if vision_tower is not None else vit.VisionTower(cfg.vision, rngs=rngs)
    self.projector = (Projector(cfg, rngs=rngs) if cfg.perceiver is None
                      else idefics2.Connector(cfg.perceiver, cfg.vision.width, cfg.text, rngs=rngs))
    self.decoder = decoder if decoder is not None else llama.Decoder(cfg.text, rngs=rngs)

  def image_features(self, images: jax.Array) -> jax.Array:
    """[N, H, W, 3] normalised images -> projected features [N, num_image_tokens, text width]."""
    return self.projector(self.vision_tower(images))

  def embed(self, input_ids: jax.Array, images: jax.Array | None = None) -> jax.Array:
    """Text embeddings with each image's projected features at its image-token positions."""
    cfg = self.config
    embeds = self.decoder.embed(input_ids)  # image tokens embed as themselves, then get overwritten (as HF)
    if images is None or images.shape[0] == 0:
      return embeds
    check_image_tokens(input_ids, images.shape[0], cfg)
    merged = merge_image_features(embeds, input_ids, self.image_features(images), cfg.image_token_id)
    return sharding.shard(merged, ("batch", "length", "act_embed"))

  def __call__(self, input_ids: jax.Array, images: jax.Array | None = None, *, positions=None,
               attention_mask=None, cache=None, return_hidden: bool = False):
    return self.decoder(inputs_embeds=self.embed(input_ids, images), positions=positions,
                        attention_mask=attention_mask, cache=cache, return_hidden=return_hidden)

  # -- the sampler protocol (models/sampler.py) -------------------------------------------------------

  def init_cache(self, batch: int, max_len: int, dtype=None) -> llama.KVCache:
    return self.decoder.init_cache(batch, max_len, dtype)

  def hidden_states(self, input_ids=None, *, inputs_embeds=None, images=None, positions=None,
                    attention_mask=None, cache=None):
    if input_ids is not None:
      input_ids, inputs_embeds = None, self.embed(input_ids, images)
    return self.decoder.hidden_states(inputs_embeds=inputs_embeds, positions=positions,
                                      attention_mask=attention_mask, cache=cache)

  def logits(self, hidden: jax.Array) -> jax.Array:
    return self.decoder.logits(hidden)


_embed_jit = nnx.jit(lambda model, ids, images: model.embed(ids, images))


def sample(model: VLM, input_ids, prompt_mask, images=None, config: sampler.SamplingConfig = sampler.SamplingConfig(),
           *, rng: jax.Array | None = None) -> sampler.SampleOutput:
  """Generate from prompts with images: prefill on the merged embeddings, then KV-cache decoding.

  input_ids [B, T] (image placeholders already expanded), prompt_mask [B, T] bool (either padding side),
  images [total_images, H, W, 3] normalised, in order of appearance.
  """
  input_ids = jnp.asarray(input_ids, jnp.int32)
  if images is not None:
    images = jnp.asarray(images)
    check_image_tokens(input_ids, images.shape[0], model.config)
  embeds = _embed_jit(model, input_ids, images)
  return sampler.sample(model, None, prompt_mask, config, rng=rng, prompt_embeds=embeds)


def init_vlm(cfg: VLMConfig, seed: int = 0) -> VLM:
  return VLM(cfg, rngs=nnx.Rngs(seed))
