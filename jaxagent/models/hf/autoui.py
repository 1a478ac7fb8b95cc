"""AutoUI checkpoints (DigiRL's `T5ForMultimodalGeneration`: a T5 state dict plus `image_dense`, `mha_layer`,
`gate_dense`) and plain `T5ForConditionalGeneration` ones <-> `autoui.AutoUI` / `t5.T5`.

| HF | ours |
|---|---|
| `shared.weight` (`{encoder,decoder}.embed_tokens.weight` are the same tensor) | `t5.shared.embedding` |
| `{stack}.block.i.layer.0.SelfAttention.{q,k,v,o}.weight` | `t5.{stack}.blocks.i.self_attn.{q,k,v,o}.kernel` |
| `{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight` | `...blocks.0.self_attn.relative_attention_bias` |
| `decoder.block.i.layer.1.EncDecAttention.*` | `t5.decoder.blocks.i.cross_attn.*` |
| `{stack}.block.i.layer.{1|2}.DenseReluDense.{wi,wi_0,wi_1,wo}.weight` | `t5.{stack}.blocks.i.ff.*` |
| `mha_layer.in_proj_weight` [3E, E], `mha_layer.out_proj.*` | `mha_in.kernel` [E, 3, E], `mha_out.*` |

The image width (`img_dim`) is read from `image_dense.weight`; checkpoints are safetensors (convert a
`pytorch_model.bin` with `transformers` first).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from jaxagent.models import autoui, t5
from jaxagent.models.hf import clip, io
from jaxagent.models.hf.io import IDENTITY, TRANSPOSE, Transform


def t5_table(cfg: t5.T5Config, ours_prefix: str = "") -> dict[str, tuple[str, Transform]]:
  e, h, d = cfg.d_model, cfg.num_heads, cfg.d_kv
  qkv = Transform(groups=((h, d), (e,)), perm=(2, 0, 1))  # [H*D, E] -> [E, H, D]
  out = Transform(groups=((e,), (h, d)), perm=(1, 2, 0))  # [E, H*D] -> [H, D, E]
  p = ours_prefix
  table = {f"{p}shared.embedding": ("shared.weight", IDENTITY)}
  if not cfg.tie_word_embeddings:
    table[f"{p}lm_head.kernel"] = ("lm_head.weight", TRANSPOSE)
  for stack, n in (("encoder", cfg.num_layers), ("decoder", cfg.num_decoder_layers)):
    table[f"{p}{stack}.final_norm.scale"] = (f"{stack}.final_layer_norm.weight", IDENTITY)
    for i in range(n):
      ours, hf = f"{p}{stack}.blocks.{i}.", f"{stack}.block.{i}.layer."
      attns = [("self", "0.SelfAttention")] + ([("cross", "1.EncDecAttention")] if stack == "decoder" else [])
      for name, key in attns:
        table[f"{ours}{name}_norm.scale"] = (f"{hf}{key.split('.')[0]}.layer_norm.weight", IDENTITY)
        for proj in ("q", "k", "v"):
          table[f"{ours}{name}_attn.{proj}.kernel"] = (f"{hf}{key}.{proj}.weight", qkv)
        table[f"{ours}{name}_attn.o.kernel"] = (f"{hf}{key}.o.weight", out)
      if i == 0:
        table[f"{ours}self_attn.relative_attention_bias"] = (f"{hf}0.SelfAttention.relative_attention_bias.weight",
                                                            IDENTITY)
      ff = f"{hf}{2 if stack == 'decoder' else 1}."
      table[f"{ours}ff_norm.scale"] = (f"{ff}layer_norm.weight", IDENTITY)
      for w in (("wi_0", "wi_1", "wo") if cfg.feed_forward.startswith("gated") else ("wi", "wo")):
        table[f"{ours}ff.{w}.kernel"] = (f"{ff}DenseReluDense.{w}.weight", TRANSPOSE)
  return table


def param_table(cfg: autoui.AutoUIConfig) -> dict[str, tuple[str, Transform]]:
  e = cfg.text.d_model
  table = t5_table(cfg.text, "t5.")
  table.update({
      "image_dense.kernel": ("image_dense.weight", TRANSPOSE), "image_dense.bias": ("image_dense.bias", IDENTITY),
      "mha_in.kernel": ("mha_layer.in_proj_weight", Transform(groups=((3, e), (e,)), perm=(2, 0, 1))),
      "mha_in.bias": ("mha_layer.in_proj_bias", Transform(groups=((3, e),))),
      "mha_out.kernel": ("mha_layer.out_proj.weight", TRANSPOSE),
      "mha_out.bias": ("mha_layer.out_proj.bias", IDENTITY),
      "gate_dense.kernel": ("gate_dense.weight", TRANSPOSE), "gate_dense.bias": ("gate_dense.bias", IDENTITY)})
  return table


def _ignored(key: str) -> bool:
  # Tied copies of `shared.weight`, and the unused cross-attention bias DigiRL's loader also skips.
  return key.endswith("embed_tokens.weight") or key.endswith("EncDecAttention.relative_attention_bias.weight")


def config_from_dir(path, **overrides) -> autoui.AutoUIConfig:
  hf = clip.read_config(path)
  if hf.get("model_type") != "t5":
    raise ValueError(f"config.json model_type={hf.get('model_type')!r}; AutoUI checkpoints are T5 ('t5')")
  keys = io.SafetensorsDir(path)
  if "image_dense.weight" not in keys.keys():
    raise io.CheckpointMismatchError(f"{path} has no image_dense.weight: a plain T5 checkpoint, not AutoUI's "
                                     "T5ForMultimodalGeneration (load it with load_t5)")
  return autoui.AutoUIConfig(text=t5.T5Config.from_hf(hf, **overrides), img_dim=keys.shape("image_dense.weight")[1])


def load_pretrained(path, mesh=None, *, rules=None, **overrides) -> tuple[autoui.AutoUI, autoui.AutoUIConfig]:
  cfg = config_from_dir(path, **overrides)
  abstract = nnx.eval_shape(lambda: autoui.AutoUI(cfg, rngs=nnx.Rngs(0)))
  ignore = lambda k: _ignored(k) or (cfg.text.tie_word_embeddings and k == "lm_head.weight")
  return io.load_state(abstract, param_table(cfg), path, mesh=mesh, rules=rules, ignore=ignore), cfg


def load_t5(path, mesh=None, *, rules=None, **overrides) -> tuple[t5.T5, t5.T5Config]:
  """A plain `T5ForConditionalGeneration` (e.g. FLAN-T5, AutoUI's own start) as `t5.T5`."""
  cfg = t5.T5Config.from_hf(clip.read_config(path), **overrides)
  abstract = nnx.eval_shape(lambda: t5.T5(cfg, rngs=nnx.Rngs(0)))
  ignore = lambda k: _ignored(k) or (cfg.tie_word_embeddings and k == "lm_head.weight")
  return io.load_state(abstract, t5_table(cfg), path, mesh=mesh, rules=rules, ignore=ignore), cfg


def save_pretrained(model: autoui.AutoUI, cfg: autoui.AutoUIConfig, path, *, dtype=None) -> None:
  """A directory DigiRL's `T5ForMultimodalGeneration.from_pretrained(path, img_dim=...)` loads."""
  hf = {**cfg.text.to_hf(), "architectures": ["T5ForMultimodalGeneration"], "img_dim": cfg.img_dim}
  if dtype is not None:
    hf["dtype"] = str(jnp.dtype(dtype))
  clip.write_config(hf, path)
  io.save_state(model, param_table(cfg), path, dtype=dtype)
