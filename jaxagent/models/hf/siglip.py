"""Hugging Face `SiglipVisionModel` <-> `vit.VisionTower(family="siglip")`: the config and the tensor table.

The encoder rows are CLIP's (`hf/clip.encoder_table`). The attention-pooling head is a PyTorch
`nn.MultiheadAttention`, whose q/k/v live in one `in_proj_weight` [3*H*D, E]; our `PoolAttention` keeps that
fusion (`in_proj.kernel` [E, 3, H, D]) so the table stays one row per tensor.
"""

from __future__ import annotations

from typing import Mapping

import jax.numpy as jnp

from jaxagent.models import vit
from jaxagent.models.hf import clip, io
from jaxagent.models.hf.io import IDENTITY, Transform


def param_table(cfg: vit.ViTConfig, prefix: str = clip.EXPORT_PREFIX) -> dict[str, tuple[str, Transform]]:
  if cfg.family != "siglip":
    raise ValueError(f"hf.siglip.param_table: ViTConfig.family={cfg.family!r}; use hf.clip for CLIP towers")
  table = clip.encoder_table(cfg, prefix)
  if cfg.pool_head:
    e, h, d = cfg.width, cfg.num_heads, cfg.head_dim
    hf = f"{prefix}head"
    table["head.probe"] = (f"{hf}.probe", IDENTITY)
    table["head.attn.in_proj.kernel"] = (f"{hf}.attention.in_proj_weight",
                                         Transform(groups=((3, h, d), (e,)), perm=(3, 0, 1, 2)))
    table["head.attn.in_proj.bias"] = (f"{hf}.attention.in_proj_bias", Transform(groups=((3, h, d),)))
    table["head.attn.out.kernel"] = (f"{hf}.attention.out_proj.weight",
                                     Transform(groups=((e,), (h, d)), perm=(1, 2, 0)))
    table["head.attn.out.bias"] = (f"{hf}.attention.out_proj.bias", IDENTITY)
    table.update(clip.layer_norm_rows("head.norm", f"{hf}.layernorm"))
    table.update(clip.mlp_rows("head.mlp", f"{hf}.mlp"))
  return table


def config_from_hf(hf: Mapping, **overrides) -> vit.ViTConfig:
  """`SiglipVisionConfig` dict (or a `SiglipConfig` dict, whose `vision_config` is used) -> ViTConfig."""
  hf = dict(hf.get("vision_config") or hf)
  if hf.get("model_type", "siglip_vision_model") not in ("siglip_vision_model", "siglip"):
    raise ValueError(f"config.json model_type={hf.get('model_type')!r} is not a SigLIP vision tower")
  clip._check_rgb(hf)
  return vit.ViTConfig.siglip(**{**dict(
      image_size=clip.square(hf, "image_size", 224), patch_size=clip.square(hf, "patch_size", 16),
      width=hf.get("hidden_size", 768), depth=hf.get("num_hidden_layers", 12),
      num_heads=hf.get("num_attention_heads", 12), mlp_dim=hf.get("intermediate_size", 3072),
      act=hf.get("hidden_act", "gelu_pytorch_tanh"), norm_eps=hf.get("layer_norm_eps", 1e-6),
      pool_head=bool(hf.get("vision_use_head", True))), **overrides})


def config_to_hf(cfg: vit.ViTConfig) -> dict:
  act = "gelu_pytorch_tanh" if cfg.act == "gelu_tanh" else cfg.act
  return dict(model_type="siglip_vision_model", architectures=["SiglipVisionModel"], hidden_size=cfg.width,
              intermediate_size=cfg.mlp_dim, num_hidden_layers=cfg.depth, num_attention_heads=cfg.num_heads,
              num_channels=3, image_size=cfg.image_size, patch_size=cfg.patch_size, hidden_act=act,
              layer_norm_eps=cfg.norm_eps, attention_dropout=0.0, vision_use_head=cfg.pool_head,
              dtype=cfg.param_dtype)


def load_pretrained(path, mesh=None, *, rules=None, dtype="float32", param_dtype="float32",
                    **overrides) -> tuple[vit.VisionTower, vit.ViTConfig]:
  """A SigLIP vision tower from a local HF checkpoint; `pool_head=False` drops the pooling head."""
  return clip.load_tower(path, config_from_hf, param_table, mesh, rules=rules, dtype=dtype,
                         param_dtype=param_dtype, **overrides)


def save_pretrained(model: vit.VisionTower, config: vit.ViTConfig, path, *, dtype=None) -> None:
  """Write a directory `transformers.SiglipVisionModel.from_pretrained` loads."""
  hf = config_to_hf(config)
  if dtype is not None:
    hf["dtype"] = str(jnp.dtype(dtype))
  clip.write_config(hf, path)
  io.save_state(model, param_table(config), path, dtype=dtype)
