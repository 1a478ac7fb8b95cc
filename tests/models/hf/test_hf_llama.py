"""HF parity for the Llama-family decoder: tiny random `transformers` models, saved, loaded by us, compared."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from jaxagent import sharding
from jaxagent.models import sampler
from jaxagent.models.hf import io
from jaxagent.models.hf import llama as hf_llama

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
CASES = {
    "llama3_scaled_untied": (transformers.LlamaConfig, dict(
        COMMON, tie_word_embeddings=False, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16})),
    "llama_tied": (transformers.LlamaConfig, dict(COMMON, tie_word_embeddings=True, rope_theta=500.0)),
    "mistral_window": (transformers.MistralConfig, dict(COMMON, sliding_window=5, tie_word_embeddings=False)),
    "qwen2_bias_tied": (transformers.Qwen2Config, dict(COMMON, tie_word_embeddings=True)),
}
SEQ = 12
REL_TOL = 1e-4


def _random_hf_model(config_cls, kwargs, seed=0):
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config_cls(**kwargs), dtype=torch.float32).eval()
  with torch.no_grad():  # HF zero-initialises biases and ones norms; randomise so that every tensor matters
    for p in model.parameters():
      p.normal_(0.0, 0.15)
  return model


_SAVED = {}


def _saved_case(name, tmp_path_factory):
  """(name, hf_model, checkpoint dir, our model, our config), built once per module."""
  if name not in _SAVED:
    config_cls, kwargs = CASES[name]
    hf_model = _random_hf_model(config_cls, kwargs)
    path = tmp_path_factory.mktemp(name)
    hf_model.save_pretrained(path)
    model, cfg = hf_llama.load_pretrained(path)
    _SAVED[name] = (name, hf_model, path, model, cfg)
  return _SAVED[name]


@pytest.fixture(scope="module", params=sorted(CASES))
def hf_case(request, tmp_path_factory):
  return _saved_case(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def llama_case(tmp_path_factory):
  return _saved_case("llama3_scaled_untied", tmp_path_factory)


def _batch(vocab, seed=1):
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab, size=(3, SEQ))
  mask = np.ones((3, SEQ), bool)
  mask[1, 8:] = False  # right padding
  mask[2, :5] = False  # left padding
  ids[~mask] = 0
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  return ids, mask, positions


def _hf_logits(hf_model, ids, mask, positions):
  with torch.no_grad():
    out = hf_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
                   position_ids=torch.tensor(positions))
  return out.logits.numpy()


def _rel_err(ours, ref, mask):
  return float(np.max(np.abs(ours - ref)[mask]) / np.max(np.abs(ref)[mask]))


@pytest.mark.slow
def test_logits_match_transformers_with_padding(hf_case):
  name, hf_model, _, model, cfg = hf_case
  ids, mask, positions = _batch(cfg.vocab_size)
  ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
  ref = _hf_logits(hf_model, ids, mask, positions)
  assert _rel_err(ours, ref, mask) <= REL_TOL, name


def test_greedy_decoding_matches_generate(hf_case):
  name, hf_model, _, model, cfg = hf_case
  prompt = np.random.default_rng(2).integers(3, cfg.vocab_size, size=(1, 7))
  with torch.no_grad():
    ref = hf_model.generate(torch.tensor(prompt), attention_mask=torch.ones_like(torch.tensor(prompt)),
                            do_sample=False, max_new_tokens=20, min_new_tokens=20, pad_token_id=0)
  ref = ref.numpy()[0, prompt.shape[1]:]
  out = sampler.sample(model, jnp.asarray(prompt), jnp.ones(prompt.shape, bool),
                       sampler.SamplingConfig(max_new_tokens=20, temperature=0.0, eos_ids=()))
  np.testing.assert_array_equal(np.asarray(out.tokens[0]), ref, err_msg=name)


@pytest.mark.slow
def test_export_reloads_in_transformers_with_identical_tensors(hf_case, tmp_path):
  name, hf_model, _, model, cfg = hf_case
  out = tmp_path / "export"
  hf_llama.save_pretrained(model, cfg, out, max_shard_bytes=20_000)  # forces shards + index
  assert (out / io.INDEX_FILE).exists()
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  assert type(reloaded) is type(hf_model)
  want, got = hf_model.state_dict(), reloaded.state_dict()
  assert set(want) == set(got)
  for key in want:
    torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)
  ids, mask, positions = _batch(cfg.vocab_size, seed=3)
  np.testing.assert_array_equal(_hf_logits(reloaded, ids, mask, positions),
                                _hf_logits(hf_model, ids, mask, positions))
  # and our loader reads the sharded index back
  again, _ = hf_llama.load_pretrained(out)
  np.testing.assert_array_equal(np.asarray(again(jnp.asarray(ids))), np.asarray(model(jnp.asarray(ids))))


def _corrupt(src, dst, edit):
  os.makedirs(dst)
  with open(os.path.join(src, "config.json")) as f:
    config = json.load(f)
  with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(config, f)
  tensors = load_file(os.path.join(src, "model.safetensors"))
  edit(tensors)
  save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def test_missing_unexpected_or_misshaped_tensor_is_named(llama_case, tmp_path):
  _, _, path, _, _ = llama_case
  key = "model.layers.1.self_attn.k_proj.weight"
  _corrupt(path, tmp_path / "missing", lambda t: t.pop(key))
  with pytest.raises(io.CheckpointMismatchError, match=rf"missing tensor '{key}' \(expected shape \(16, 32\)\)"):
    hf_llama.load_pretrained(tmp_path / "missing")
  _corrupt(path, tmp_path / "wrong", lambda t: t.update({key: t[key][:8]}))
  with pytest.raises(io.CheckpointMismatchError, match=rf"'{key}' has shape \(8, 32\), expected \(16, 32\)"):
    hf_llama.load_pretrained(tmp_path / "wrong")
  _corrupt(path, tmp_path / "extra", lambda t: t.update({"model.layers.9.mlp.up_proj.weight": t[key]}))
  with pytest.raises(io.CheckpointMismatchError, match="unexpected tensor 'model.layers.9.mlp.up_proj.weight'"):
    hf_llama.load_pretrained(tmp_path / "extra")


@pytest.mark.slow
def test_sharded_load_on_8_devices_follows_rules_keeps_logits_and_samples(llama_case):
  _, _, path, model, cfg = llama_case
  mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
  sharded, _ = hf_llama.load_pretrained(path, mesh=mesh)
  params = io.flat_params(sharded)
  for name, var in params.items():
    value = var.get_value()
    want = sharding.logical_to_spec(var.get_metadata()["logical_axes"], value.shape, mesh)
    assert value.sharding.spec == want, name
  assert params["layers.0.self_attn.q_proj.kernel"].get_value().sharding.spec == jax.P("fsdp", "tensor")
  assert params["layers.0.mlp.down_proj.kernel"].get_value().sharding.spec == jax.P("tensor", "fsdp")
  assert params["lm_head.kernel"].get_value().sharding.spec == jax.P("fsdp", "tensor")
  reference = io.flat_params(model)
  for name, var in params.items():
    np.testing.assert_array_equal(np.asarray(var.get_value()), np.asarray(reference[name].get_value()), name)
  ids, mask, _ = _batch(cfg.vocab_size)
  with jax.set_mesh(mesh):
    logits = jax.jit(lambda m, x, k: m(x, attention_mask=k))(sharded, jnp.asarray(ids), jnp.asarray(mask))
  expected = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
  assert _rel_err(np.asarray(logits), expected, mask) <= 1e-5
  config = sampler.SamplingConfig(max_new_tokens=4, temperature=0.0)
  ids, mask = jnp.asarray(ids), jnp.asarray(mask)
  with jax.set_mesh(mesh):
    sharded_tokens = sampler.sample(sharded, ids, mask, config).tokens
  np.testing.assert_array_equal(sharded_tokens, sampler.sample(model, ids, mask, config).tokens)
