"""Hugging Face `CLIPVisionModel` <-> `vit.VisionTower(family="clip")`: the config and the tensor table.

The encoder layout (`encoder.layers.N.{layer_norm1,self_attn,layer_norm2,mlp}`) is shared with SigLIP, so
`encoder_table` serves `hf/siglip.py` and the LLaVA tower too. Checkpoints name the tower with or without a
`vision_model.` prefix (`CLIPModel` and transformers 4 saves vs. transformers 5 `CLIPVisionModel` saves);
`find_prefix` detects which, and we export with the prefix, which both major versions read.
Loading and saving (sharded, slice by slice) is `hf/io.py`'s.
"""

from __future__ import annotations

import json
import os
from typing import Iterable, Mapping

import jax.numpy as jnp
from flax import nnx

from jaxagent.models import vit
from jaxagent.models.hf import io
from jaxagent.models.hf.io import IDENTITY, TRANSPOSE, Transform

EXPORT_PREFIX = "vision_model."


def layer_norm_rows(ours: str, hf: str) -> dict:
  return {f"{ours}.scale": (f"{hf}.weight", IDENTITY), f"{ours}.bias": (f"{hf}.bias", IDENTITY)}


def mlp_rows(ours: str, hf: str) -> dict:
  return {f"{ours}.fc1.kernel": (f"{hf}.fc1.weight", TRANSPOSE), f"{ours}.fc1.bias": (f"{hf}.fc1.bias", IDENTITY),
          f"{ours}.fc2.kernel": (f"{hf}.fc2.weight", TRANSPOSE), f"{ours}.fc2.bias": (f"{hf}.fc2.bias", IDENTITY)}


def attention_rows(cfg: vit.ViTConfig, ours: str, hf: str) -> dict:
  """q/k/v Linear [H*D, E] -> kernel [E, H, D], bias [H*D] -> [H, D]; out [E, H*D] -> [H, D, E]."""
  e, h, d = cfg.width, cfg.num_heads, cfg.head_dim
  rows = {}
  for name in ("q", "k", "v"):
    rows[f"{ours}.{name}.kernel"] = (f"{hf}.{name}_proj.weight", Transform(groups=((h, d), (e,)), perm=(2, 0, 1)))
    rows[f"{ours}.{name}.bias"] = (f"{hf}.{name}_proj.bias", Transform(groups=((h, d),)))
  rows[f"{ours}.out.kernel"] = (f"{hf}.out_proj.weight", Transform(groups=((e,), (h, d)), perm=(1, 2, 0)))
  rows[f"{ours}.out.bias"] = (f"{hf}.out_proj.bias", IDENTITY)
  return rows


def encoder_table(cfg: vit.ViTConfig, prefix: str = "") -> dict[str, tuple[str, Transform]]:
  """Embeddings, blocks and post-norm: the rows CLIP and SigLIP towers share (HF names after `prefix`)."""
  p = prefix
  table = {
      # Conv2d [out, in, kh, kw] -> our HWIO patch kernel [kh, kw, in, out].
      "patch_embed.kernel": (f"{p}embeddings.patch_embedding.weight", Transform(perm=(2, 3, 1, 0))),
      "pos_embed": (f"{p}embeddings.position_embedding.weight", IDENTITY),
  }
  if cfg.family == "siglip":
    table["patch_embed.bias"] = (f"{p}embeddings.patch_embedding.bias", IDENTITY)
  if cfg.class_token:
    table["cls_token"] = (f"{p}embeddings.class_embedding", IDENTITY)
  if cfg.family == "clip":
    table.update(layer_norm_rows("pre_norm", f"{p}pre_layrnorm"))
  for i in range(cfg.depth):
    hf = f"{p}encoder.layers.{i}"
    table.update(layer_norm_rows(f"blocks.{i}.norm1", f"{hf}.layer_norm1"))
    table.update(attention_rows(cfg, f"blocks.{i}.attn", f"{hf}.self_attn"))
    table.update(layer_norm_rows(f"blocks.{i}.norm2", f"{hf}.layer_norm2"))
    table.update(mlp_rows(f"blocks.{i}.mlp", f"{hf}.mlp"))
  table.update(layer_norm_rows("post_norm", f"{p}post_layernorm"))
  return table


def param_table(cfg: vit.ViTConfig, prefix: str = EXPORT_PREFIX) -> dict[str, tuple[str, Transform]]:
  if cfg.family != "clip":
    raise ValueError(f"hf.clip.param_table: ViTConfig.family={cfg.family!r}; use hf.siglip for SigLIP towers")
  return encoder_table(cfg, prefix)


def find_prefix(keys: Iterable[str], root: str = "") -> str:
  """`root` or `root + "vision_model."`, whichever the checkpoint's keys use for the tower."""
  keys = set(keys)
  for prefix in (root + "vision_model.", root):
    if f"{prefix}embeddings.patch_embedding.weight" in keys:
      return prefix
  raise io.CheckpointMismatchError(
      f"no vision tower in the checkpoint: neither '{root}vision_model.embeddings.patch_embedding.weight' nor "
      f"'{root}embeddings.patch_embedding.weight' is there")


def config_from_hf(hf: Mapping, **overrides) -> vit.ViTConfig:
  """`CLIPVisionConfig` dict (or a `CLIPConfig` dict, whose `vision_config` is used) -> ViTConfig."""
  hf = dict(hf.get("vision_config") or hf)
  if hf.get("model_type", "clip_vision_model") not in ("clip_vision_model", "clip"):
    raise ValueError(f"config.json model_type={hf.get('model_type')!r} is not a CLIP vision tower")
  _check_rgb(hf)
  return vit.ViTConfig.clip(**{**dict(
      image_size=square(hf, "image_size", 224), patch_size=square(hf, "patch_size", 32),
      width=hf.get("hidden_size", 768), depth=hf.get("num_hidden_layers", 12),
      num_heads=hf.get("num_attention_heads", 12), mlp_dim=hf.get("intermediate_size", 3072),
      act=hf.get("hidden_act", "quick_gelu"), norm_eps=hf.get("layer_norm_eps", 1e-5)), **overrides})


def config_to_hf(cfg: vit.ViTConfig) -> dict:
  return dict(model_type="clip_vision_model", architectures=["CLIPVisionModel"], hidden_size=cfg.width,
              intermediate_size=cfg.mlp_dim, num_hidden_layers=cfg.depth, num_attention_heads=cfg.num_heads,
              num_channels=3, image_size=cfg.image_size, patch_size=cfg.patch_size, hidden_act=cfg.act,
              layer_norm_eps=cfg.norm_eps, attention_dropout=0.0, dtype=cfg.param_dtype)


def square(hf: Mapping, key: str, default: int) -> int:
  value = hf.get(key, default)
  if isinstance(value, (list, tuple)):
    if len(set(value)) != 1:
      raise NotImplementedError(f"config.json {key}={value}: only square sizes are supported")
    value = value[0]
  return int(value)


def _check_rgb(hf: Mapping) -> None:
  if hf.get("num_channels", 3) != 3:
    raise NotImplementedError(f"config.json num_channels={hf['num_channels']}; only RGB (3) is supported")


def read_config(path) -> dict:
  config_path = os.path.join(os.fspath(path), "config.json")
  if not os.path.exists(config_path):
    raise FileNotFoundError(f"{config_path} not found; a HF checkpoint directory needs its config.json")
  with open(config_path) as f:
    return json.load(f)


def write_config(hf: dict, path) -> None:
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(os.fspath(path), "config.json"), "w") as f:
    json.dump(hf, f, indent=2)


def load_tower(path, config_from_hf_fn, table_fn, mesh=None, *, rules=None, dtype="float32",
               param_dtype="float32", **overrides) -> tuple[vit.VisionTower, vit.ViTConfig]:
  """A tower from a checkpoint directory (vision-only or a full CLIP/SigLIP model: other tensors are ignored)."""
  cfg = config_from_hf_fn(read_config(path), dtype=dtype, param_dtype=param_dtype, **overrides)
  prefix = find_prefix(io.SafetensorsDir(path).keys())
  abstract = nnx.eval_shape(lambda: vit.VisionTower(cfg, rngs=nnx.Rngs(0)))
  table = table_fn(cfg, prefix)
  wanted = {key for key, _ in table.values()}
  # A full CLIPModel/SiglipModel checkpoint also holds the text tower; a SigLIP head may be left unused.
  ignore = lambda key: key not in wanted and (not key.startswith(prefix) or key.startswith(prefix + "head."))
  return io.load_state(abstract, table, path, mesh=mesh, rules=rules, ignore=ignore), cfg


def load_pretrained(path, mesh=None, *, rules=None, dtype="float32", param_dtype="float32",
                    **overrides) -> tuple[vit.VisionTower, vit.ViTConfig]:
  """A CLIP vision tower from a local HF checkpoint; `overrides` set ViTConfig fields (e.g. `select_layer=-2`)."""
  return load_tower(path, config_from_hf, param_table, mesh, rules=rules, dtype=dtype, param_dtype=param_dtype,
                    **overrides)


def save_pretrained(model: vit.VisionTower, config: vit.ViTConfig, path, *, dtype=None) -> None:
  """Write a directory `transformers.CLIPVisionModel.from_pretrained` loads."""
  hf = config_to_hf(config)
  if dtype is not None:
    hf["dtype"] = str(jnp.dtype(dtype))
  write_config(hf, path)
  io.save_state(model, param_table(config), path, dtype=dtype)
