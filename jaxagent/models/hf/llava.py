"""Hugging Face `LlavaForConditionalGeneration` (CLIP tower) <-> `vlm.VLM`.

The table is three tables side by side: the CLIP tower's (`hf/clip.py`), the projector's two Linears, and the
decoder's (`hf/llama.py`). Checkpoints come in two spellings, both read here:

| part | llava-hf / transformers-5 saves | transformers-5 in-memory names |
|---|---|---|
| tower | `vision_tower.vision_model.*` (or `vision_tower.*`) | `model.vision_tower.*` |
| projector | `multi_modal_projector.linear_{1,2}.*` | `model.multi_modal_projector.*` |
| decoder | `language_model.model.*`, `language_model.lm_head.weight` | `model.language_model.*`, `lm_head.weight` |

Export writes the first spelling (what `save_pretrained` itself writes and every transformers version reads).
The processor and tokenizer stay with the checkpoint directory: copy them alongside (`save_pretrained`'s
`processor_from`) and load them with `transformers.AutoProcessor.from_pretrained(path)`.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent import sharding
from jaxagent.models import llama, vit, vlm
from jaxagent.models.hf import clip, io
from jaxagent.models.hf import llama as hf_llama
from jaxagent.models.hf.io import IDENTITY, TRANSPOSE

# LlavaConfig's own defaults for a vision_config that names only some fields (llava-hf/llava-1.5-7b-hf does).
_LLAVA_CLIP_DEFAULTS = dict(intermediate_size=4096, hidden_size=1024, patch_size=14, image_size=336,
                            num_hidden_layers=24, num_attention_heads=16)
# Files that belong to the tokenizer/processor rather than the weights.
PROCESSOR_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "added_tokens.json", "vocab.json", "merges.txt", "preprocessor_config.json",
                   "processor_config.json", "chat_template.json", "chat_template.jinja", "generation_config.json")


def _prefixes(keys: set[str]) -> tuple[str, str, str, str]:
  """(tower, projector, decoder, lm_head key) for whichever spelling the checkpoint uses."""
  if any(k.startswith("model.language_model.") for k in keys):
    root, decoder, head = "model.", "model.language_model.", "lm_head.weight"
  else:
    root, decoder, head = "", "language_model.model.", "language_model.lm_head.weight"
  return clip.find_prefix(keys, root + "vision_tower."), root + "multi_modal_projector.", decoder, head


def param_table(cfg: vlm.VLMConfig, keys: set[str] | None = None) -> dict:
  """{our path: (HF key, Transform)}; `keys` (a checkpoint's) picks its spelling, None the export spelling."""
  if keys is None:
    tower, proj, decoder, head = "vision_tower.vision_model.", "multi_modal_projector.", "language_model.model.", \
        "language_model.lm_head.weight"
  else:
    tower, proj, decoder, head = _prefixes(keys)
  table = {f"vision_tower.{k}": v for k, v in clip.param_table(cfg.vision, tower).items()}
  for name in ("linear_1", "linear_2"):
    table[f"projector.{name}.kernel"] = (f"{proj}{name}.weight", TRANSPOSE)
    if cfg.projector_bias:
      table[f"projector.{name}.bias"] = (f"{proj}{name}.bias", IDENTITY)
  for ours, (key, tr) in hf_llama.param_table(cfg.text, decoder).items():
    table[f"decoder.{ours}"] = (head if key == "lm_head.weight" else key, tr)
  return table


def config_from_hf(hf: dict, **overrides) -> vlm.VLMConfig:
  """A `LlavaConfig` dict -> VLMConfig. Overrides: `dtype`, `param_dtype`, `remat` apply to both towers."""
  if hf.get("model_type") != "llava":
    raise ValueError(f"config.json model_type={hf.get('model_type')!r}; hf.llava reads LlavaForConditionalGeneration "
                     "checkpoints (model_type 'llava')")
  layer = hf.get("vision_feature_layer", -2)
  if not isinstance(layer, int):
    raise NotImplementedError(f"config.json vision_feature_layer={layer}: only a single layer is supported")
  strategy = hf.get("vision_feature_select_strategy", "default")
  if strategy not in ("default", "full"):
    raise ValueError(f"config.json vision_feature_select_strategy={strategy!r} is not 'default' or 'full'")
  vision_hf = {**_LLAVA_CLIP_DEFAULTS, **(hf.get("vision_config") or {})}
  if vision_hf.get("model_type", "clip_vision_model") != "clip_vision_model":
    raise NotImplementedError(f"config.json vision_config.model_type={vision_hf['model_type']!r}: hf.llava "
                              "supports CLIP towers only")
  shared = {k: overrides.pop(k) for k in ("dtype", "param_dtype", "remat") if k in overrides}
  vision = clip.config_from_hf(vision_hf, select_layer=layer,
                               select_feature="patch" if strategy == "default" else "cls_patch", **shared)
  text_hf = dict(hf.get("text_config") or {})
  text_hf.setdefault("model_type", "llama")
  if hf.get("tie_word_embeddings"):
    text_hf["tie_word_embeddings"] = True
  text = llama.DecoderConfig.from_hf(text_hf, **shared)
  token = hf.get("image_token_id", hf.get("image_token_index", 32000))
  return vlm.VLMConfig(vision=vision, text=text, image_token_id=token,
                       projector_act=hf.get("projector_hidden_act", "gelu"),
                       projector_bias=hf.get("multimodal_projector_bias", True), **overrides)


def config_from_dir(path, **overrides) -> vlm.VLMConfig:
  return config_from_hf(clip.read_config(path), **overrides)


def config_to_hf(cfg: vlm.VLMConfig) -> dict:
  if cfg.vision.family != "clip":
    raise ValueError("hf.llava exports CLIP towers only (LlavaForConditionalGeneration with CLIPVisionModel)")
  if cfg.vision.select_layer is None:
    raise ValueError("VLMConfig.vision.select_layer must be set to export LLaVA (HF's vision_feature_layer); "
                     "use -1 for the last block")
  text = cfg.text.to_hf()
  return dict(
      architectures=["LlavaForConditionalGeneration"], model_type="llava", vision_config=clip.config_to_hf(cfg.vision),
      text_config=text, image_token_index=cfg.image_token_id, image_seq_length=cfg.num_image_tokens,
      projector_hidden_act=cfg.projector_act, multimodal_projector_bias=cfg.projector_bias,
      vision_feature_layer=cfg.vision.select_layer,
      vision_feature_select_strategy="default" if cfg.vision.select_feature == "patch" else "full",
      tie_word_embeddings=cfg.text.tie_word_embeddings, dtype=cfg.text.param_dtype)


def _ignored(key: str) -> bool:
  # Non-parameter buffers some (older) exports include.
  return key.endswith("rotary_emb.inv_freq") or key.endswith("position_ids")


def load_pretrained(path, mesh=None, *, rules=None, dtype="float32", param_dtype="float32",
                    **overrides) -> tuple[vlm.VLM, vlm.VLMConfig]:
  """A VLM from a local `LlavaForConditionalGeneration` checkpoint, each parameter placed with its sharding."""
  cfg = config_from_hf(clip.read_config(path), dtype=dtype, param_dtype=param_dtype, **overrides)
  keys = io.SafetensorsDir(path).keys()
  table = param_table(cfg, keys)
  tied_head = _prefixes(keys)[3]
  ignore = lambda key: _ignored(key) or (cfg.text.tie_word_embeddings and key == tied_head)
  abstract = nnx.eval_shape(lambda: vlm.VLM(cfg, rngs=nnx.Rngs(0)))
  return io.load_state(abstract, table, path, mesh=mesh, rules=rules, ignore=ignore), cfg


def save_pretrained(model: vlm.VLM, config: vlm.VLMConfig, path, *, dtype=None, processor_from=None,
                    max_shard_bytes: int = 5 * 2**30) -> None:
  """Write a directory `transformers.LlavaForConditionalGeneration.from_pretrained` loads and runs.

  `processor_from`: a checkpoint directory whose tokenizer/processor files are copied alongside, so that
  `AutoProcessor.from_pretrained(path)` works on the export.
  """
  hf = config_to_hf(config)
  if dtype is not None:
    hf["dtype"] = hf["text_config"]["dtype"] = hf["vision_config"]["dtype"] = str(jnp.dtype(dtype))
  clip.write_config(hf, path)
  io.save_state(model, param_table(config), path, dtype=dtype, max_shard_bytes=max_shard_bytes)
  if processor_from is not None:
    for name in PROCESSOR_FILES:
      src = os.path.join(os.fspath(processor_from), name)
      if os.path.exists(src) and os.path.abspath(src) != os.path.abspath(os.path.join(os.fspath(path), name)):
        shutil.copy(src, path)


def from_pretrained_parts(vision_path, text_path, image_token_id: int, mesh=None, *, select_layer: int = -2,
                          select_feature: str = "patch", seed: int = 0, rules=None, dtype="float32",
                          param_dtype="float32") -> tuple[vlm.VLM, vlm.VLMConfig]:
  """LLaVA's starting point: a pretrained CLIP or SigLIP tower and a pretrained Llama-family LM joined by a
  freshly initialised projector. `image_token_id` must be in the LM's vocabulary (add it to the tokenizer and
  resize first)."""
  kind = clip.read_config(vision_path)
  kind = (kind.get("vision_config") or kind).get("model_type", "")
  from jaxagent.models.hf import siglip  # pylint: disable=g-import-not-at-top
  tower_lib = siglip if kind.startswith("siglip") else clip
  tower, vision_cfg = tower_lib.load_pretrained(vision_path, mesh, rules=rules, dtype=dtype, param_dtype=param_dtype,
                                                select_layer=select_layer, select_feature=select_feature)
  decoder, text_cfg = hf_llama.load_pretrained(text_path, mesh, dtype, param_dtype, rules=rules)
  cfg = vlm.VLMConfig(vision=vision_cfg, text=text_cfg, image_token_id=image_token_id)
  model = vlm.VLM(cfg, rngs=nnx.Rngs(seed), vision_tower=tower, decoder=decoder)
  if mesh is not None:
    state = nnx.state(model.projector)
    nnx.update(model.projector, jax.device_put(state, sharding.state_shardings(state, mesh, rules)))
  return model, cfg


def image_preprocessing(path) -> vit.ImagePreprocessing:
  """Our numpy preprocessing with the checkpoint's CLIP image-processor settings (`preprocessor_config.json`,
  or the `image_processor` entry of a `processor_config.json`)."""
  path = os.fspath(path)
  if os.path.exists(os.path.join(path, "preprocessor_config.json")):
    with open(os.path.join(path, "preprocessor_config.json")) as f:
      pp = json.load(f)
  elif os.path.exists(os.path.join(path, "processor_config.json")):
    with open(os.path.join(path, "processor_config.json")) as f:
      pp = json.load(f).get("image_processor", {})
  else:
    raise FileNotFoundError(f"{path!r} has no preprocessor_config.json or processor_config.json; copy the "
                            "processor files next to the weights (save_pretrained(..., processor_from=...))")
  size, crop = pp.get("size", {"shortest_edge": 224}), pp.get("crop_size", {"height": 224})
  if not isinstance(size, dict) or not isinstance(crop, dict):
    raise ValueError(f"processor config: size={size!r}, crop_size={crop!r}; expected HF dicts "
                     "({'shortest_edge': N} or {'height': N, 'width': N})")
  return vit.ImagePreprocessing(
      size=size.get("shortest_edge", size.get("height")), shortest_edge="shortest_edge" in size,
      crop_size=crop.get("height") if pp.get("do_center_crop", True) else None,
      mean=tuple(pp.get("image_mean", vit.OPENAI_CLIP_MEAN)), std=tuple(pp.get("image_std", vit.OPENAI_CLIP_STD)))
