"""Hugging Face `Idefics2ForConditionalGeneration` (OpenWebVoyager's idefics2-8b) <-> `vlm.VLM` with a perceiver.

| part | HF keys | ours |
|---|---|---|
| tower | `model.vision_model.*` (SigLIP rows, no head) | `vision_tower.*`, `position_grid` set |
| projection | `model.connector.modality_projection.{gate,up,down}_proj.weight` | `projector.modality_projection.*` |
| resampler | `model.connector.perceiver_resampler.{latents, layers.i.*, norm.weight}` | `projector.{latents, layers.i.*, norm}` |
| decoder | `model.text_model.*`, `lm_head.weight` | `decoder.*` |

Our images are square (padded to a square with the mean colour, resized to `image_size`), one per `<image>`,
without idefics2's image splitting; the processor config written on export says so (`do_image_splitting: false`,
both edges `image_size`), so `transformers.AutoProcessor` prepares the same tokens, and the same pixels for a
square screenshot (its processor pads a non-square one at the bottom and right, where ours pads to a square).
"""

from __future__ import annotations

import json
import os
import shutil

import jax.numpy as jnp
from flax import nnx

from jaxagent.models import idefics2, llama, vit, vlm
from jaxagent.models.hf import clip, io
from jaxagent.models.hf import llama as hf_llama
from jaxagent.models.hf.io import IDENTITY, TRANSPOSE, Transform

PREFIX = "model."
WRAP_TOKEN = "<fake_token_around_image>"
# Idefics2Config's text_config defaults (MistralConfig's, with idefics2's overrides) for a config that omits some.
_MISTRAL_DEFAULTS = dict(model_type="mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
                         max_position_embeddings=4096 * 8, rms_norm_eps=1e-5, rope_theta=10000.0,
                         sliding_window=4096, pad_token_id=0)


def _gated_rows(ours: str, hf: str) -> dict:
  return {f"{ours}.{n}.kernel": (f"{hf}.{n}.weight", TRANSPOSE) for n in ("gate_proj", "up_proj", "down_proj")}


def param_table(cfg: vlm.VLMConfig) -> dict[str, tuple[str, Transform]]:
  """{our path: (HF key, Transform)}: one spelling, which transformers 4 and 5 both save and read."""
  p, e = cfg.perceiver, cfg.text.hidden_size
  table = {f"vision_tower.{k}": v for k, v in clip.encoder_table(cfg.vision, f"{PREFIX}vision_model.").items()}
  conn = f"{PREFIX}connector."
  table.update(_gated_rows("projector.modality_projection", f"{conn}modality_projection"))
  res = f"{conn}perceiver_resampler."
  table["projector.latents"] = (f"{res}latents", IDENTITY)
  table["projector.norm.scale"] = (f"{res}norm.weight", IDENTITY)
  q_in = Transform(groups=((p.num_heads, p.head_dim), (e,)), perm=(2, 0, 1))
  kv_in = Transform(groups=((p.num_kv_heads, p.head_dim), (e,)), perm=(2, 0, 1))
  o_in = Transform(groups=((e,), (p.num_heads, p.head_dim)), perm=(1, 2, 0))
  for i in range(p.depth):
    ours, hf = f"projector.layers.{i}.", f"{res}layers.{i}."
    for norm in ("input_latents_norm", "input_context_norm", "post_attention_layernorm"):
      table[f"{ours}{norm}.scale"] = (f"{hf}{norm}.weight", IDENTITY)
    for name, tr in (("q_proj", q_in), ("k_proj", kv_in), ("v_proj", kv_in), ("o_proj", o_in)):
      table[f"{ours}self_attn.{name}.kernel"] = (f"{hf}self_attn.{name}.weight", tr)
    table.update(_gated_rows(f"{ours}mlp", f"{hf}mlp"))
  for ours, (key, tr) in hf_llama.param_table(cfg.text, f"{PREFIX}text_model.").items():
    table[f"decoder.{ours}"] = (key, tr)
  return table


def config_from_hf(hf: dict, *, image_size: int | None = None, wrap_token_id: int | None = None,
                   **overrides) -> vlm.VLMConfig:
  """An `Idefics2Config` dict -> VLMConfig. `image_size`: the side our square images are fed at (default the
  tower's own, 980 for idefics2-8b); positions are bucketed onto the tower's grid as HF does."""
  if hf.get("model_type") != "idefics2":
    raise ValueError(f"config.json model_type={hf.get('model_type')!r}; hf.idefics2 reads "
                     "Idefics2ForConditionalGeneration checkpoints (model_type 'idefics2')")
  shared = {k: overrides.pop(k) for k in ("dtype", "param_dtype", "remat") if k in overrides}
  text_hf = {**_MISTRAL_DEFAULTS, **(hf.get("text_config") or {})}
  if hf.get("tie_word_embeddings"):
    text_hf["tie_word_embeddings"] = True
  text = llama.DecoderConfig.from_hf(text_hf, **shared)
  v = {"image_size": 224, "patch_size": 32, **(hf.get("vision_config") or {})}
  tower_size, patch = clip.square(v, "image_size", 224), clip.square(v, "patch_size", 32)
  vision = vit.ViTConfig.siglip(
      image_size=image_size or tower_size, patch_size=patch, width=v.get("hidden_size", 768),
      depth=v.get("num_hidden_layers", 12), num_heads=v.get("num_attention_heads", 12),
      mlp_dim=v.get("intermediate_size", 3072), act=v.get("hidden_act", "gelu_pytorch_tanh"),
      norm_eps=v.get("layer_norm_eps", 1e-6), pool_head=False, position_grid=tower_size // patch,
      **{k: val for k, val in shared.items() if k != "remat"})
  r = hf.get("perceiver_config") or {}
  perceiver = idefics2.PerceiverConfig(
      n_latents=r.get("resampler_n_latents", 64), depth=r.get("resampler_depth", 3),
      num_heads=r.get("resampler_n_heads", 16), head_dim=r.get("resampler_head_dim", 96),
      num_kv_heads=r.get("num_key_value_heads", 4), act=r.get("hidden_act", "silu"),
      rms_norm_eps=r.get("rms_norm_eps", text.rms_norm_eps), projection_dim=text.intermediate_size,
      projection_act=text_hf.get("hidden_act", "silu"))
  return vlm.VLMConfig(vision=vision, text=text, image_token_id=hf.get("image_token_id", 32001),
                       perceiver=perceiver, image_wrap_token_id=wrap_token_id, **overrides)


def config_to_hf(cfg: vlm.VLMConfig) -> dict:
  if cfg.perceiver is None or not cfg.vision.position_grid:
    raise ValueError("hf.idefics2 exports VLMs with a perceiver connector and a bucketed-position SigLIP tower")
  v, p = cfg.vision, cfg.perceiver
  return dict(
      architectures=["Idefics2ForConditionalGeneration"], model_type="idefics2", image_token_id=cfg.image_token_id,
      tie_word_embeddings=cfg.text.tie_word_embeddings, dtype=cfg.text.param_dtype, text_config=cfg.text.to_hf(),
      vision_config=dict(model_type="idefics2_vision", hidden_size=v.width, intermediate_size=v.mlp_dim,
                         num_hidden_layers=v.depth, num_attention_heads=v.num_heads, num_channels=3,
                         image_size=v.position_grid * v.patch_size, patch_size=v.patch_size,
                         hidden_act="gelu_pytorch_tanh" if v.act == "gelu_tanh" else v.act,
                         layer_norm_eps=v.norm_eps),
      perceiver_config=dict(model_type="idefics2_perceiver", hidden_act=p.act, hidden_size=cfg.text.hidden_size,
                            rms_norm_eps=p.rms_norm_eps, resampler_n_latents=p.n_latents, resampler_depth=p.depth,
                            resampler_n_heads=p.num_heads, resampler_head_dim=p.head_dim,
                            num_key_value_heads=p.num_kv_heads))


def wrap_token_id(path) -> int | None:
  """The id of `<fake_token_around_image>` in the checkpoint's tokenizer (None when it has none, or no tokenizer)."""
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  if not any(os.path.exists(os.path.join(os.fspath(path), f)) for f in ("tokenizer.json", "tokenizer.model")):
    return None
  tok = AutoTokenizer.from_pretrained(os.fspath(path))
  tid = tok.convert_tokens_to_ids(WRAP_TOKEN)
  return None if tid in (None, tok.unk_token_id) else int(tid)


def config_from_dir(path, **overrides) -> vlm.VLMConfig:
  """The checkpoint's config, its tokenizer's `<fake_token_around_image>` as the wrapping token."""
  return config_from_hf(clip.read_config(path), wrap_token_id=wrap_token_id(path), **overrides)


def load_pretrained(path, mesh=None, *, rules=None, dtype="float32", param_dtype="float32",
                    **overrides) -> tuple[vlm.VLM, vlm.VLMConfig]:
  """A VLM from a local idefics2 checkpoint, each parameter placed with its sharding."""
  cfg = config_from_dir(path, dtype=dtype, param_dtype=param_dtype, **overrides)
  ignore = lambda key: key.endswith("rotary_emb.inv_freq") or (cfg.text.tie_word_embeddings and key == "lm_head.weight")
  abstract = nnx.eval_shape(lambda: vlm.VLM(cfg, rngs=nnx.Rngs(0)))
  return io.load_state(abstract, param_table(cfg), path, mesh=mesh, rules=rules, ignore=ignore), cfg


def save_pretrained(model: vlm.VLM, config: vlm.VLMConfig, path, *, dtype=None, processor_from=None,
                    max_shard_bytes: int = 5 * 2**30) -> None:
  """Write a directory `transformers.Idefics2ForConditionalGeneration.from_pretrained` loads and runs;
  `processor_from`: a checkpoint whose tokenizer files are copied alongside, with a processor config for our
  square, unsplit images."""
  hf = config_to_hf(config)
  if dtype is not None:
    hf["dtype"] = hf["text_config"]["dtype"] = str(jnp.dtype(dtype))
  clip.write_config(hf, path)
  io.save_state(model, param_table(config), path, dtype=dtype, max_shard_bytes=max_shard_bytes)
  if processor_from is not None:
    from jaxagent.models.hf.llava import PROCESSOR_FILES  # pylint: disable=g-import-not-at-top
    for name in PROCESSOR_FILES:
      src = os.path.join(os.fspath(processor_from), name)
      if name not in ("preprocessor_config.json", "processor_config.json") and os.path.exists(src):
        shutil.copy(src, path)
    write_processor_config(config, path)


def write_processor_config(cfg: vlm.VLMConfig, path) -> None:
  """`Idefics2Processor` settings that reproduce our pixels and tokens: no splitting, both edges the image
  side, SigLIP's normalisation, `n_latents` image tokens."""
  side = cfg.vision.image_size
  image = dict(image_processor_type="Idefics2ImageProcessor", do_convert_rgb=True, do_resize=True,
               size={"shortest_edge": side, "longest_edge": side}, resample=3, do_rescale=True,
               rescale_factor=1 / 255, do_normalize=True, image_mean=list(vit.SIGLIP_MEAN),
               image_std=list(vit.SIGLIP_STD), do_pad=True, do_image_splitting=False)
  with open(os.path.join(os.fspath(path), "preprocessor_config.json"), "w") as f:
    json.dump(image, f, indent=2)
  with open(os.path.join(os.fspath(path), "processor_config.json"), "w") as f:
    json.dump({"processor_class": "Idefics2Processor", "image_seq_len": cfg.num_image_tokens}, f, indent=2)


def image_preprocessing(path) -> vit.ImagePreprocessing:
  """Square images at the tower's input side, SigLIP-normalised (idefics2's mean and std are 0.5)."""
  side = config_from_hf(clip.read_config(path)).vision.image_size  # no tokenizer needed for the side
  return vit.ImagePreprocessing.siglip(side, pad_to_square=True)
