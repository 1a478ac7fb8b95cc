"""Hugging Face `Qwen2_5_VLForConditionalGeneration` <-> `qwen2_vl.Qwen2VL`.

The table is two tables side by side: the vision tower's (below) and the Qwen2 decoder's (`hf/llama.py`).
Checkpoints come in two spellings, both read here:

| part | Qwen/Qwen2.5-VL-* and transformers-5 `save_pretrained` | transformers-5 in-memory names |
|---|---|---|
| tower | `visual.*` | `model.visual.*` |
| decoder | `model.*`, `lm_head.weight` | `model.language_model.*`, `lm_head.weight` |

Export writes the first spelling (what `save_pretrained` itself writes and every transformers version reads).
Config: transformers 5 nests `text_config`; the released checkpoints keep the text fields at the top level with
`rope_scaling: {"type": "mrope", "mrope_section": [...]}`; both are read.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
from flax import nnx

from jaxagent.models import llama, qwen2_vl
from jaxagent.models.hf import clip, io
from jaxagent.models.hf import llama as hf_llama
from jaxagent.models.hf.io import IDENTITY, TRANSPOSE, Transform

CONV_TO_OURS = Transform(perm=(1, 2, 3, 4, 0))  # Conv3d weight [E, C, T, P, P] -> our channels-last [C, T, P, P, E]


def _prefixes(keys: set[str] | None) -> tuple[str, str]:
  """(tower, decoder) prefixes for whichever spelling the checkpoint uses; None: the export spelling."""
  if keys is not None and any(k.startswith("model.language_model.") for k in keys):
    return "model.visual.", "model.language_model."
  return "visual.", "model."


def vision_table(cfg: qwen2_vl.VisionConfig, prefix: str = "visual.") -> dict[str, tuple[str, Transform]]:
  """{our VisionTower path: (HF key, Transform)}: Linear weights [out, in] transpose to our [in, out] kernels."""
  table = {"patch_embed": (f"{prefix}patch_embed.proj.weight", CONV_TO_OURS),
           "ln_q.scale": (f"{prefix}merger.ln_q.weight", IDENTITY)}
  for ours, hf in (("mlp_0", "merger.mlp.0"), ("mlp_2", "merger.mlp.2")):
    table[f"{ours}.kernel"] = (f"{prefix}{hf}.weight", TRANSPOSE)
    table[f"{ours}.bias"] = (f"{prefix}{hf}.bias", IDENTITY)
  for i in range(cfg.depth):
    ours, hf = f"blocks.{i}.", f"{prefix}blocks.{i}."
    table[ours + "norm1.scale"] = (hf + "norm1.weight", IDENTITY)
    table[ours + "norm2.scale"] = (hf + "norm2.weight", IDENTITY)
    for name, hf_name in (("qkv", "attn.qkv"), ("proj", "attn.proj"), ("gate_proj", "mlp.gate_proj"),
                          ("up_proj", "mlp.up_proj"), ("down_proj", "mlp.down_proj")):
      table[f"{ours}{name}.kernel"] = (f"{hf}{hf_name}.weight", TRANSPOSE)
      table[f"{ours}{name}.bias"] = (f"{hf}{hf_name}.bias", IDENTITY)
  return table


def param_table(cfg: qwen2_vl.Qwen2VLConfig, keys: set[str] | None = None) -> dict[str, tuple[str, Transform]]:
  """{our Qwen2VL path: (HF key, Transform)}; `keys` (a checkpoint's) picks its spelling, None the export one."""
  tower, decoder = _prefixes(keys)
  table = {f"visual.{k}": v for k, v in vision_table(cfg.vision, tower).items()}
  table.update({f"decoder.{k}": v for k, v in hf_llama.param_table(cfg.text, decoder).items()})
  return table


def _rope(text: dict) -> tuple[float, tuple[int, ...]]:
  """(rope_theta, mrope_section) from transformers-5 `rope_parameters` or the released `rope_scaling`."""
  rope = {**(text.get("rope_scaling") or {}), **(text.get("rope_parameters") or {})}
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in ("default", "mrope"):
    raise NotImplementedError(f"config.json rope type {kind!r}; Qwen2.5-VL's M-RoPE is 'default'/'mrope' only")
  theta = float(rope.get("rope_theta", text.get("rope_theta", 1000000.0)))
  return theta, tuple(int(s) for s in rope.get("mrope_section", (16, 24, 24)))


def config_from_hf(hf: dict, **overrides) -> qwen2_vl.Qwen2VLConfig:
  """A `Qwen2_5_VLConfig` dict -> Qwen2VLConfig. `dtype`, `param_dtype`, `remat` go to the decoder; other
  overrides to Qwen2VLConfig fields."""
  if hf.get("model_type") != "qwen2_5_vl":
    raise ValueError(f"config.json model_type={hf.get('model_type')!r}; hf.qwen2_vl reads "
                     "Qwen2_5_VLForConditionalGeneration checkpoints (model_type 'qwen2_5_vl')")
  text = dict(hf.get("text_config") or hf)
  if text.get("use_sliding_window"):
    raise NotImplementedError("config.json use_sliding_window=true is not supported for Qwen2.5-VL")
  theta, section = _rope(text)
  # HF's Qwen2.5-VL attention always uses head_dim = hidden_size / heads, whatever a `head_dim` field says.
  text_hf = {k: v for k, v in text.items() if k not in ("rope_scaling", "rope_parameters", "rope_theta", "head_dim",
                                                           "use_sliding_window", "sliding_window", "layer_types")}
  text_hf.update(model_type="qwen2", rope_parameters={"rope_type": "default", "rope_theta": theta})
  text_hf.setdefault("max_position_embeddings", 32768)
  if hf.get("tie_word_embeddings") or text.get("tie_word_embeddings"):
    text_hf["tie_word_embeddings"] = True
  shared = {k: overrides.pop(k) for k in ("dtype", "param_dtype", "remat") if k in overrides}
  ids = {k: hf[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
         if hf.get(k) is not None}
  return qwen2_vl.Qwen2VLConfig(vision=qwen2_vl.VisionConfig.from_hf(hf.get("vision_config") or {}),
                                text=llama.DecoderConfig.from_hf(text_hf, **shared), mrope_section=section,
                                **{**ids, **overrides})


def config_to_hf(cfg: qwen2_vl.Qwen2VLConfig) -> dict:
  """A transformers-5 `config.json` dict (`text_config` nested) that builds the same model."""
  v, t = cfg.vision, cfg.text.to_hf()
  text = {k: val for k, val in t.items() if k not in ("architectures", "use_sliding_window", "sliding_window",
                                                      "max_window_layers", "layer_types", "head_dim")}
  text.update(model_type="qwen2_5_vl_text", use_sliding_window=False,
              rope_parameters={"rope_type": "default", "rope_theta": cfg.text.rope_theta,
                               "mrope_section": list(cfg.mrope_section)})
  vision = dict(model_type="qwen2_5_vl_vision", depth=v.depth, hidden_size=v.hidden_size, hidden_act=v.act,
                intermediate_size=v.intermediate_size, num_heads=v.num_heads, out_hidden_size=v.out_hidden_size,
                patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                spatial_merge_size=v.spatial_merge_size, window_size=v.window_size,
                fullatt_block_indexes=list(v.fullatt_block_indexes), in_channels=3,
                rope_parameters={"rope_type": "axial", "rope_theta": v.rope_theta})
  return dict(architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl", text_config=text,
              vision_config=vision, image_token_id=cfg.image_token_id, video_token_id=cfg.video_token_id,
              vision_start_token_id=cfg.vision_start_token_id, vision_end_token_id=cfg.vision_end_token_id,
              tie_word_embeddings=cfg.text.tie_word_embeddings, dtype=cfg.text.param_dtype)


def config_from_dir(path, **overrides) -> qwen2_vl.Qwen2VLConfig:
  return config_from_hf(clip.read_config(path), **overrides)


def _ignored(key: str) -> bool:
  # Non-parameter buffers some exports include.
  return key.endswith("rotary_emb.inv_freq") or key.endswith("rotary_pos_emb.inv_freq")


def load(path, mesh=None, *, rules=None, dtype="float32", param_dtype="float32",
         **overrides) -> tuple[qwen2_vl.Qwen2VL, qwen2_vl.Qwen2VLConfig]:
  """A Qwen2VL from a local checkpoint directory, each parameter placed with its sharding (vision tower: float32,
  the tower does not take a dtype)."""
  cfg = config_from_dir(path, dtype=dtype, param_dtype=param_dtype, **overrides)
  keys = io.SafetensorsDir(path).keys()
  ignore = lambda key: _ignored(key) or (cfg.text.tie_word_embeddings and key == "lm_head.weight")
  abstract = nnx.eval_shape(lambda: qwen2_vl.Qwen2VL(cfg, rngs=nnx.Rngs(0)))
  return io.load_state(abstract, param_table(cfg, keys), path, mesh=mesh, rules=rules, ignore=ignore), cfg


load_pretrained = load


def save_pretrained(model: qwen2_vl.Qwen2VL, config: qwen2_vl.Qwen2VLConfig, path, *, dtype=None,
                    max_shard_bytes: int = 5 * 2**30) -> None:
  """Write a directory `transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained` loads and runs."""
  hf = config_to_hf(config)
  if dtype is not None:
    hf["dtype"] = hf["text_config"]["dtype"] = str(jnp.dtype(dtype))
  clip.write_config(hf, path)
  io.save_state(model, param_table(config), os.fspath(path), dtype=dtype, max_shard_bytes=max_shard_bytes)
