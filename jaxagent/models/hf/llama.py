"""Hugging Face LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM ⇄ `models.llama.Decoder`.

One mapping table (`param_table`) serves loading and saving. Our kernels are `[in, out]` with heads as
their own axis; HF Linear weights are `[out, in]` with heads flattened, hence the split + transpose.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
from flax import nnx

from jaxagent.models import llama
from jaxagent.models.hf import io
from jaxagent.models.hf.io import IDENTITY, TRANSPOSE, Transform


def param_table(cfg: llama.DecoderConfig, prefix: str = "model.") -> dict[str, tuple[str, Transform]]:
  """{our param path: (HF key, Transform)} for every parameter of `Decoder(cfg)`.

  `prefix` is where the decoder lives in the HF checkpoint (`model.` for *ForCausalLM; a VLM passes its own,
  e.g. `model.language_model.`); `lm_head.weight` stays at the top level.
  """
  e, h, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  q_in = Transform(groups=((h, d), (e,)), perm=(2, 0, 1))  # [H*D, E] -> [E, H, D]
  kv_in = Transform(groups=((k, d), (e,)), perm=(2, 0, 1))
  o_in = Transform(groups=((e,), (h, d)), perm=(1, 2, 0))  # [E, H*D] -> [H, D, E]
  q_bias, kv_bias = Transform(groups=((h, d),)), Transform(groups=((k, d),))
  table = {"embed_tokens.embedding": (f"{prefix}embed_tokens.weight", IDENTITY),
           "norm.scale": (f"{prefix}norm.weight", IDENTITY)}
  if not cfg.tie_word_embeddings:
    table["lm_head.kernel"] = ("lm_head.weight", TRANSPOSE)
  if cfg.copy_head:  # the project's own (`llama.CopyHead`); transformers leaves these keys unread
    for name in ("query", "key", "gate"):
      table[f"copy_head.{name}.kernel"] = (f"{prefix}copy_head.{name}.weight", TRANSPOSE)
    table["copy_head.gate.bias"] = (f"{prefix}copy_head.gate.bias", IDENTITY)
  for i in range(cfg.num_layers):
    ours, hf = f"layers.{i}.", f"{prefix}layers.{i}."
    table[ours + "input_layernorm.scale"] = (hf + "input_layernorm.weight", IDENTITY)
    table[ours + "post_attention_layernorm.scale"] = (hf + "post_attention_layernorm.weight", IDENTITY)
    for name, tr, bias_tr in (("q_proj", q_in, q_bias), ("k_proj", kv_in, kv_bias), ("v_proj", kv_in, kv_bias)):
      table[f"{ours}self_attn.{name}.kernel"] = (f"{hf}self_attn.{name}.weight", tr)
      if cfg.attention_bias:
        table[f"{ours}self_attn.{name}.bias"] = (f"{hf}self_attn.{name}.bias", bias_tr)
    table[ours + "self_attn.o_proj.kernel"] = (hf + "self_attn.o_proj.weight", o_in)
    if cfg.attention_out_bias:
      table[ours + "self_attn.o_proj.bias"] = (hf + "self_attn.o_proj.bias", IDENTITY)
    for name in ("gate_proj", "up_proj", "down_proj"):
      table[f"{ours}mlp.{name}.kernel"] = (f"{hf}mlp.{name}.weight", TRANSPOSE)
  return table


def _ignored(key: str) -> bool:
  # Non-parameter buffers some exports include; a tied lm_head duplicate is the same tensor as the embedding.
  return key.endswith("rotary_emb.inv_freq") or key == "lm_head.weight"


def read_config(path: str | os.PathLike) -> dict:
  config_path = os.path.join(os.fspath(path), "config.json")
  if not os.path.exists(config_path):
    raise FileNotFoundError(f"{config_path} not found; a HF checkpoint directory needs its config.json")
  with open(config_path) as f:
    return json.load(f)


def load_pretrained(path: str | os.PathLike, mesh=None, dtype="float32", param_dtype="float32", *,
                    rules=None, **config_overrides) -> tuple[llama.Decoder, llama.DecoderConfig]:
  """Load a local HF checkpoint into a `Decoder`, each parameter placed with its mesh sharding.

  `dtype` is the compute dtype, `param_dtype` the storage dtype; other keyword arguments override
  `DecoderConfig` fields (e.g. `remat=True`).
  """
  cfg = llama.DecoderConfig.from_hf(read_config(path), dtype=dtype, param_dtype=param_dtype, **config_overrides)
  abstract = nnx.eval_shape(lambda: llama.Decoder(cfg, rngs=nnx.Rngs(0)))
  ignore = (lambda key: key.endswith("rotary_emb.inv_freq")) if not cfg.tie_word_embeddings else _ignored
  model = io.load_state(abstract, param_table(cfg), path, mesh=mesh, rules=rules, ignore=ignore)
  return model, cfg


def save_pretrained(model: llama.Decoder, config: llama.DecoderConfig, path: str | os.PathLike, *,
                    dtype=None, max_shard_bytes: int = 5 * 2**30) -> None:
  """Write `config.json` and safetensors that `transformers.AutoModelForCausalLM.from_pretrained` runs."""
  os.makedirs(path, exist_ok=True)
  hf = config.to_hf()
  if dtype is not None:
    hf["dtype"] = str(jnp.dtype(dtype))
  with open(os.path.join(os.fspath(path), "config.json"), "w") as f:
    json.dump(hf, f, indent=2)
  io.save_state(model, param_table(config), path, dtype=dtype, max_shard_bytes=max_shard_bytes)
