"""Flax NNX models, and `build(config, tokenizer)`: the model a config describes, from `config.model` alone.

Training (`pipeline.finetune`), serving (`serving.checkpoint.load_policy`) and the recipes all build through
`build`, so a checkpoint rebuilds without knowing which recipe wrote it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from flax import nnx

from jaxagent.tokens import IMAGE_TOKEN

MODEL_KINDS = ("vlm", "decoder", "autoui")
DTYPES = ("float32", "bfloat16", "float16")
# `layers.REMAT_POLICIES`, named here without importing JAX
REMAT = ("none", "full", "dots", "dots_no_batch", "projections")
ATTENTION = ("xla", "flash", "cudnn")  # `layers.ATTENTION_IMPLS`
# `lora.TARGETS` and `lora.DEFAULT_TARGETS`, named here without importing JAX: the language decoder's attention
# and MLP projections, LLaVA's projector, the ViT tower's attention and MLP
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "linear_1", "linear_2",
                "q", "k", "v", "out", "fc1", "fc2")
DEFAULT_LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def precision(mcfg) -> dict:
  """`config.model`'s `dtype`, `param_dtype` and `remat`, as the model configs take them (float32 and no remat
  for a config written before the keys existed); a bad value is a ValueError naming the key."""
  out = {"dtype": mcfg.get("dtype", "float32"), "param_dtype": mcfg.get("param_dtype", "float32"),
         "remat": mcfg.get("remat", "none")}
  for key, allowed in (("dtype", DTYPES), ("param_dtype", DTYPES), ("remat", REMAT)):
    if out[key] not in allowed:
      raise ValueError(f"config.model.{key}={out[key]!r} is not one of {allowed}; set --config.model.{key}="
                       f"{allowed[0]} (or another of those)")
  return out


def attention(mcfg) -> str:
  """`config.model.attention`: the kernel a Llama-family decoder's training and scoring pass uses for attention
  ("xla" for a config written before the key existed); a bad value or combination is a ValueError naming the
  key. "flash" (`layers.flash_attention`: memory linear in the sequence length) runs anywhere; "cudnn" (cuDNN's
  fused flash attention) needs bfloat16 or float16 compute and a GPU, checked at build."""
  value = mcfg.get("attention", "xla")
  if value not in ATTENTION:
    raise ValueError(f"config.model.attention={value!r} is not one of {ATTENTION}; set --config.model.attention=xla")
  if value == "cudnn" and mcfg.get("dtype", "float32") not in ("bfloat16", "float16"):
    raise ValueError(f"config.model.attention='cudnn' computes in bfloat16 or float16 but config.model.dtype="
                     f"{mcfg.get('dtype', 'float32')!r}; set --config.model.dtype=bfloat16 (or attention=xla)")
  if value != "xla" and (mcfg.get("kind") == "autoui" or (mcfg.get("hf_checkpoint") and mcfg.get("kind") == "vlm")):
    raise ValueError(f"config.model.attention={value!r} is wired for Llama-family decoders (model.kind=decoder, "
                     "and the tiny VLM's language model), not for this model; set --config.model.attention=xla")
  return value


def lora_settings(mcfg) -> tuple[int, float, tuple[str, ...]] | None:
  """`config.model.lora` as (rank, alpha, targets), or None when off (rank 0, or a config written before the
  block existed); a bad value is a ValueError naming the key and the fix."""
  block = mcfg.get("lora")
  if block is None:
    return None
  rank, alpha, targets = block.get("rank", 0), block.get("alpha", 16.0), block.get("targets", DEFAULT_LORA_TARGETS)
  if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
    raise ValueError(f"config.model.lora.rank={rank!r}: must be a whole number >= 0 (0: no adapters, full "
                     "fine-tuning); set --config.model.lora.rank=8 (or 0)")
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
    raise ValueError(f"config.model.lora.alpha={alpha!r}: must be a number > 0 (adapters scale by alpha / rank); "
                     "set --config.model.lora.alpha=16.0")
  names = ([t.strip() for t in targets.split(",")] if isinstance(targets, str)
           else [str(t).strip() for t in targets] if isinstance(targets, (list, tuple)) else None)
  names = tuple(t for t in names or () if t)
  unknown = sorted(set(names) - set(LORA_TARGETS))
  if not names or unknown:
    what = f"{unknown} are not linears LoRA adapts" if unknown else "names no linear"
    raise ValueError(f"config.model.lora.targets={targets!r}: {what}; name one or more of {LORA_TARGETS}, "
                     f"comma-separated (default --config.model.lora.targets={DEFAULT_LORA_TARGETS})")
  if rank == 0:
    return None
  decoder_only = DEFAULT_LORA_TARGETS.split(",")
  if mcfg.get("kind") == "decoder" and set(names) - set(decoder_only):
    raise ValueError(f"config.model.lora.targets={targets!r}: {sorted(set(names) - set(decoder_only))} are VLM "
                     f"linears but model.kind=decoder; name only {', '.join(decoder_only)}")
  if mcfg.get("kind") == "autoui":
    raise ValueError(f"config.model.lora.rank={rank}: LoRA adapts the Llama-family decoder and the VLM, not "
                     "AutoUI's T5 (model.kind=autoui); set --config.model.lora.rank=0")
  return rank, float(alpha), names


@dataclasses.dataclass(frozen=True)
class BuiltModel:
  """What a config's model is: how to initialise it, what it costs, and how images reach it.

  `init()` builds the model from its seed (deterministic, run under `jax.jit` with sharded outputs);
  `pretrained()`, when the config names a local HF checkpoint, returns the model with its weights (a fresh run
  starts from it; a resumed one restores its own checkpoint instead).
  """

  kind: str  # "vlm" | "decoder" | "autoui"
  init: Callable[[], nnx.Module]
  flops_per_token: float  # analytic training FLOPs per text token, for MFU
  num_image_tokens: int = 1  # image-token ids each <image> expands to (1 for a decoder: a plain token)
  preprocess: object = None  # models.vit.ImagePreprocessing (VLMs); None: text only
  pretrained: Callable[[], nnx.Module] | None = None
  image_wrap_id: int | None = None  # idefics2's <fake_token_around_image> around each image's tokens
  trainable: object = nnx.Param  # the NNX filter of what the optimizer trains (AutoUI: all but its frozen encoder;
  # LoRA: the adapters alone)
  lora: tuple[int, float, tuple[str, ...]] | None = None  # (rank, alpha, targets) of `config.model.lora`; None: off
  seed: int = 0  # the adapters' initialisation seed

  def adapt(self, model: nnx.Module) -> nnx.Module:
    """A model loaded from elsewhere (a training workdir, a HF directory) in this config's structure: any adapters
    it has folded into its weights, then this config's fresh adapters added (LoRA on top of the merged model)."""
    from jaxagent.models import lora  # pylint: disable=g-import-not-at-top
    model = lora.merge(model)
    return lora.add_lora(model, *self.lora, seed=self.seed) if self.lora else model

  @property
  def image_size(self) -> int:
    return (self.preprocess.crop_size or self.preprocess.size) if self.preprocess is not None else 0


def _round_up(n: int, k: int = 64) -> int:
  return -(-n // k) * k


def build(config, tokenizer) -> BuiltModel:
  """The model of `config.model` (kind, tiny-model overrides or `hf_checkpoint`) for `tokenizer`, with
  `config.data.seq_len` / `image_size` / `max_images` for its FLOP count and image size and `config.seed` for
  its initialisation. With `config.model.lora.rank` > 0, `init` and `pretrained` carry fresh adapters
  (`models.lora`) and only those train."""
  settings = lora_settings(config.model)
  built = _build(config, tokenizer)
  if settings is None:
    return built
  from jaxagent.models import lora  # pylint: disable=g-import-not-at-top
  seed = int(config.seed)
  with_lora = lambda fn: (lambda: lora.add_lora(fn(), *settings, seed=seed))
  # A frozen weight's weight-gradient matmul is never computed: 4 of its 6 training FLOPs per token remain
  # (attention's share, which keeps its whole backward, is small at these lengths).
  return dataclasses.replace(built, init=with_lora(built.init), flops_per_token=built.flops_per_token * 2 / 3,
                             pretrained=with_lora(built.pretrained) if built.pretrained is not None else None,
                             trainable=lora.LoRAParam, lora=settings, seed=seed)


def _build(config, tokenizer) -> BuiltModel:
  # Model modules import jax-heavy code: loaded here, so `import jaxagent.models.x` stays cheap.
  from jaxagent.models import flops, llama, vit, vlm  # pylint: disable=g-import-not-at-top
  mcfg, seq_len = config.model, int(config.data.seq_len)
  if mcfg.kind not in MODEL_KINDS:
    raise ValueError(f"config.model.kind={mcfg.kind!r}; use one of {MODEL_KINDS}")
  if mcfg.kind == "autoui":
    return _autoui(config, tokenizer)
  if mcfg.hf_checkpoint:
    return _from_hf(config)
  dcfg = llama.DecoderConfig.tiny(**{
      **dict(mcfg.decoder), **precision(mcfg), "attention": _attention_here(mcfg),
      "vocab_size": _round_up(len(tokenizer)),
      "max_position_embeddings": max(seq_len, 512, int(mcfg.decoder.get("max_position_embeddings", 0))),
      "pad_token_id": tokenizer.pad_token_id,
      "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id})
  seed = int(config.seed)
  if mcfg.kind == "decoder":
    return BuiltModel("decoder", lambda: llama.init_decoder(dcfg, seed), flops.decoder_flops_per_token(dcfg, seq_len))
  vcfg = vlm.VLMConfig.tiny(dcfg.vocab_size, tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                            vision={"image_size": config.data.image_size, **precision(mcfg), **mcfg.vision},
                            text=dataclasses.asdict(dcfg))
  return BuiltModel("vlm", lambda: vlm.init_vlm(vcfg, seed), _vlm_flops(vcfg, config), vcfg.num_image_tokens,
                    vit.ImagePreprocessing.for_tower(vcfg.vision, pad_to_square=True))


def _attention_here(mcfg) -> str:
  """`attention(mcfg)`, refusing "cudnn" on a machine without a GPU before anything is built."""
  import jax  # pylint: disable=g-import-not-at-top
  value = attention(mcfg)
  if value == "cudnn" and jax.default_backend() != "gpu":
    raise ValueError(f"config.model.attention='cudnn' needs a GPU; this machine's JAX backend is "
                     f"{jax.default_backend()!r}; set --config.model.attention=xla")
  return value


def _from_hf(config) -> BuiltModel:
  """`build` for `config.model.hf_checkpoint`: the architecture from its config.json; the weights are loaded
  (straight into their shardings) only when a fresh run asks for them."""
  from jaxagent import sharding  # pylint: disable=g-import-not-at-top
  from jaxagent.models import flops, llama, vit, vlm  # pylint: disable=g-import-not-at-top
  from jaxagent.models.hf import auto, gguf, llama as hf_llama  # pylint: disable=g-import-not-at-top
  path, seq_len = gguf.checkpoint_dir(config.model.hf_checkpoint), int(config.data.seq_len)
  hf, overrides = hf_llama.read_config(path), precision(config.model)
  family = config.model.get("hf_family", "")  # absent from configs written before the key existed
  if family and hf.get("model_type") != family:
    raise ValueError(f"config.model.hf_checkpoint={config.model.hf_checkpoint} is a {hf.get('model_type')!r} "
                     f"checkpoint but config.model.hf_family={family!r}; point it at a {family} directory (or set "
                     "hf_family='' to accept any)")
  mesh = lambda: sharding.make_mesh(dict(config.mesh))
  if hf.get("model_type") == "qwen2_5_vl":
    return _qwen2_5_vl(config, path, mesh)
  if config.model.kind == "decoder":
    overrides["attention"] = _attention_here(config.model)
    dcfg = llama.DecoderConfig.from_hf(hf, **overrides)
    return BuiltModel("decoder", lambda: llama.init_decoder(dcfg, 0), flops.decoder_flops_per_token(dcfg, seq_len),
                      pretrained=lambda: hf_llama.load_pretrained(path, mesh(), **overrides)[0])
  lib = auto.vlm_module(hf)  # LLaVA or idefics2
  vcfg = lib.config_from_dir(path, **overrides)
  return BuiltModel("vlm", lambda: vlm.init_vlm(vcfg, 0), _vlm_flops(vcfg, config), vcfg.num_image_tokens,
                    vit.ImagePreprocessing.for_tower(vcfg.vision, pad_to_square=True),
                    pretrained=lambda: lib.load_pretrained(path, mesh(), **overrides)[0],
                    image_wrap_id=vcfg.image_wrap_token_id)


def _qwen2_5_vl(config, path: str, mesh) -> BuiltModel:
  """`_from_hf` for a Qwen2.5-VL directory: images at one fixed side, `config.data.image_size` rounded to a multiple
  of patch × merge (`models.qwen_vl`; native dynamic resolution is not supported)."""
  from jaxagent.models import qwen2_vl, qwen_vl  # pylint: disable=g-import-not-at-top
  from jaxagent.models.hf import qwen2_vl as hf_qwen2_vl  # pylint: disable=g-import-not-at-top
  if config.model.kind != "vlm":
    raise ValueError(f"config.model.hf_checkpoint={config.model.hf_checkpoint} is a Qwen2.5-VL checkpoint but "
                     f"config.model.kind={config.model.kind!r}; set config.model.kind='vlm'")
  overrides = precision(config.model)
  qcfg = hf_qwen2_vl.config_from_dir(path, **overrides)
  images = qwen_vl.QwenImages.from_dir(path, qcfg, int(config.data.image_size))
  flops_per_token = qwen_vl.flops_per_token(qcfg, images, int(config.data.seq_len), int(config.data.max_images))
  return BuiltModel("vlm", lambda: qwen2_vl.Qwen2VL(qcfg, rngs=nnx.Rngs(0)), flops_per_token, images.tokens_per_image,
                    images, pretrained=lambda: hf_qwen2_vl.load_pretrained(path, mesh(), **overrides)[0])


_T5_SIZES = {"hidden_size": "d_model", "num_layers": ("num_layers", "num_decoder_layers"), "num_heads": "num_heads",
             "head_dim": "d_kv", "intermediate_size": "d_ff"}


def _autoui(config, tokenizer) -> BuiltModel:
  """`build` for kind "autoui": DigiRL's encoder-decoder actor (`models.autoui.ScreenAutoUI`) over a frozen ViT.

  Tiny T5 sizes come from `config.model.decoder` (hidden_size -> d_model, num_layers -> encoder and decoder
  layers, head_dim -> d_kv, intermediate_size -> d_ff; num_kv_heads has no T5 meaning); the frozen tower from
  `config.model.vision` over `config.data.image_size`, its width being AutoUI's `img_dim`. `hf_checkpoint`: an
  AutoUI (`T5ForMultimodalGeneration`) directory, whose `img_dim` the tower then takes as its width. FLOPs: 6 x the
  trained parameters per encoder token (the decoder's shorter targets ride on that count) plus the frozen tower's
  forward pass per image."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxagent.models import autoui, flops, t5, vit  # pylint: disable=g-import-not-at-top
  mcfg, seed = config.model, int(config.seed)
  vision, dtypes = dict(mcfg.vision), precision(mcfg)
  if dtypes.pop("remat") != "none":
    raise ValueError(f"config.model.remat={mcfg.remat!r}: AutoUI's T5 has no rematerialisation (its image tower is "
                     "frozen, so it keeps no activations for a backward pass); set --config.model.remat=none")
  vision.update(dtypes)
  if mcfg.hf_checkpoint:
    from jaxagent.models.hf import autoui as hf_autoui, gguf  # pylint: disable=g-import-not-at-top
    path = gguf.checkpoint_dir(mcfg.hf_checkpoint)
    acfg = hf_autoui.config_from_dir(path, **dtypes)
    if vision.get("width", acfg.img_dim) != acfg.img_dim:
      raise ValueError(f"config.model.vision.width={vision['width']} but {mcfg.hf_checkpoint} reads "
                       f"{acfg.img_dim}-wide image features; drop the override")
    vision["width"] = acfg.img_dim
  else:
    sizes = {}
    for key, value in dict(mcfg.decoder).items():
      if key != "num_kv_heads":
        if key not in _T5_SIZES:
          raise ValueError(f"config.model.decoder.{key} has no T5 counterpart for model.kind=autoui; use "
                           f"{sorted(_T5_SIZES)}")
        for field in (_T5_SIZES[key],) if isinstance(_T5_SIZES[key], str) else _T5_SIZES[key]:
          sizes[field] = int(value)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    text = t5.T5Config(**{"d_model": 128, "d_kv": 32, "d_ff": 256, "num_layers": 2, "num_decoder_layers": 2,
                          "num_heads": 4, **sizes, **dtypes, "vocab_size": _round_up(len(tokenizer)), "pad_token_id": pad,
                          "eos_token_id": int(tokenizer.eos_token_id), "decoder_start_token_id": pad})
    acfg = autoui.AutoUIConfig(text=text, img_dim=int(vision.get("width", vit.ViTConfig.tiny().width)))
  vcfg = vit.ViTConfig.tiny("clip", **{"image_size": int(config.data.image_size), **vision})
  init = lambda: autoui.init_screen_autoui(acfg, vcfg, seed)
  params = nnx.state(nnx.eval_shape(init), autoui.ScreenAutoUI.TRAINABLE)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  per_token = 6.0 * n_params + flops.vit_flops_per_image(vcfg, training=False) / int(config.data.seq_len)
  pretrained = None
  if mcfg.hf_checkpoint:

    def pretrained():
      from jaxagent import sharding  # pylint: disable=g-import-not-at-top
      model = init()
      model.autoui = hf_autoui.load_pretrained(path, sharding.make_mesh(dict(config.mesh)), **dtypes)[0]
      return model

  return BuiltModel("autoui", init, per_token, 1, vit.ImagePreprocessing.for_tower(vcfg, pad_to_square=True),
                    pretrained=pretrained, trainable=autoui.ScreenAutoUI.TRAINABLE)


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
