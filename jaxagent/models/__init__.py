"""Flax NNX models, and `build(config, tokenizer)`: the model a config describes, from `config.model` alone.

Training (`pipeline.finetune`), serving (`serving.checkpoint.load_policy`) and the recipes all build through
`build`, so a checkpoint rebuilds without knowing which recipe wrote it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from flax import nnx

MODEL_KINDS = ("vlm", "decoder")


@dataclasses.dataclass(frozen=True)
class BuiltModel:
  """What a config's model is: how to initialise it, what it costs, and how images reach it.

  `init()` builds the model from its seed (deterministic, run under `jax.jit` with sharded outputs);
  `pretrained()`, when the config names a local HF checkpoint, returns the model with its weights (a fresh run
  starts from it; a resumed one restores its own checkpoint instead).
  """

  kind: str  # "vlm" | "decoder"
  init: Callable[[], nnx.Module]
  flops_per_token: float  # analytic training FLOPs per text token, for MFU
  num_image_tokens: int = 1  # image-token ids each <image> expands to (1 for a decoder: a plain token)
  preprocess: object = None  # models.vit.ImagePreprocessing (VLMs); None: text only
  pretrained: Callable[[], nnx.Module] | None = None
  image_wrap_id: int | None = None  # idefics2's <fake_token_around_image> around each image's tokens

  @property
  def image_size(self) -> int:
    return (self.preprocess.crop_size or self.preprocess.size) if self.preprocess is not None else 0


def _round_up(n: int, k: int = 64) -> int:
  return -(-n // k) * k


def build(config, tokenizer) -> BuiltModel:
  """The model of `config.model` (kind, tiny-model overrides or `hf_checkpoint`) for `tokenizer`, with
  `config.data.seq_len` / `image_size` / `max_images` for its FLOP count and image size and `config.seed` for
  its initialisation."""
  # Model modules import jax-heavy code: loaded here, so `import jaxagent.models.x` stays cheap.
  from jaxagent.data.tokenizer import IMAGE_TOKEN  # pylint: disable=g-import-not-at-top
  from jaxagent.models import flops, llama, vit, vlm  # pylint: disable=g-import-not-at-top
  mcfg, seq_len = config.model, int(config.data.seq_len)
  if mcfg.kind not in MODEL_KINDS:
    raise ValueError(f"config.model.kind={mcfg.kind!r}; use one of {MODEL_KINDS}")
  if mcfg.hf_checkpoint:
    return _from_hf(config)
  dcfg = llama.DecoderConfig.tiny(**{
      **dict(mcfg.decoder), "vocab_size": _round_up(len(tokenizer)),
      "max_position_embeddings": max(seq_len, 512), "pad_token_id": tokenizer.pad_token_id,
      "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id})
  seed = int(config.seed)
  if mcfg.kind == "decoder":
    return BuiltModel("decoder", lambda: llama.init_decoder(dcfg, seed), flops.decoder_flops_per_token(dcfg, seq_len))
  vcfg = vlm.VLMConfig.tiny(dcfg.vocab_size, tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                            vision={"image_size": config.data.image_size, **mcfg.vision},
                            text=dataclasses.asdict(dcfg))
  return BuiltModel("vlm", lambda: vlm.init_vlm(vcfg, seed), _vlm_flops(vcfg, config), vcfg.num_image_tokens,
                    vit.ImagePreprocessing.for_tower(vcfg.vision, pad_to_square=True))


def _from_hf(config) -> BuiltModel:
  """`build` for `config.model.hf_checkpoint`: the architecture from its config.json; the weights are loaded
  (straight into their shardings) only when a fresh run asks for them."""
  from jaxagent import sharding  # pylint: disable=g-import-not-at-top
  from jaxagent.models import flops, llama, vit, vlm  # pylint: disable=g-import-not-at-top
  from jaxagent.models.hf import auto, gguf, llama as hf_llama  # pylint: disable=g-import-not-at-top
  path, seq_len = gguf.checkpoint_dir(config.model.hf_checkpoint), int(config.data.seq_len)
  hf = hf_llama.read_config(path)
  family = config.model.get("hf_family", "")  # absent from configs written before the key existed
  if family and hf.get("model_type") != family:
    raise ValueError(f"config.model.hf_checkpoint={config.model.hf_checkpoint} is a {hf.get('model_type')!r} "
                     f"checkpoint but config.model.hf_family={family!r}; point it at a {family} directory (or set "
                     "hf_family='' to accept any)")
  mesh = lambda: sharding.make_mesh(dict(config.mesh))
  if config.model.kind == "decoder":
    dcfg = llama.DecoderConfig.from_hf(hf)
    return BuiltModel("decoder", lambda: llama.init_decoder(dcfg, 0), flops.decoder_flops_per_token(dcfg, seq_len),
                      pretrained=lambda: hf_llama.load_pretrained(path, mesh())[0])
  lib = auto.vlm_module(hf)  # LLaVA or idefics2
  vcfg = lib.config_from_dir(path)
  return BuiltModel("vlm", lambda: vlm.init_vlm(vcfg, 0), _vlm_flops(vcfg, config), vcfg.num_image_tokens,
                    vit.ImagePreprocessing.for_tower(vcfg.vision, pad_to_square=True),
                    pretrained=lambda: lib.load_pretrained(path, mesh())[0], image_wrap_id=vcfg.image_wrap_token_id)


def _vlm_flops(vcfg, config) -> float:
  """Training FLOPs per text token; every sample carries max_images image slots, all run through the tower."""
  from jaxagent.models import flops  # pylint: disable=g-import-not-at-top
  e_v, e_t = vcfg.vision.width, vcfg.text.hidden_size
  if vcfg.perceiver is None:  # LLaVA's two Linears on every patch
    connector = 6 * vcfg.num_image_tokens * (e_v * e_t + e_t * e_t)
  else:  # idefics2: a SwiGLU projection on every patch, then latents attending over patches and latents
    p, n_p, n_l = vcfg.perceiver, vcfg.vision.num_patches, vcfg.perceiver.n_latents
    attn = n_l * 2 * e_t * p.num_heads * p.head_dim + (n_p + n_l) * 2 * e_t * p.num_kv_heads * p.head_dim
    connector = 6 * (n_p * p.projection_dim * (2 * e_v + e_t) + p.depth * (attn + n_l * 12 * e_t * e_t))
  per_image = flops.vit_flops_per_image(vcfg.vision) + connector
  seq_len = int(config.data.seq_len)
  return flops.decoder_flops_per_token(vcfg.text, seq_len) + int(config.data.max_images) / seq_len * per_image
