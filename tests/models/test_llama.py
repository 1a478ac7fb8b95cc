"""Decoder behaviour that parity tests do not pin down: cache protocol, padding, remat, dtypes, configs."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxagent import sharding
from jaxagent.models import layers, llama

CFG = llama.DecoderConfig.tiny(sliding_window=6)
# Jitted calls: op-by-op dispatch of an eager forward is what makes tests slow on a busy CPU.
run = jax.jit(lambda m, *args, **kwargs: m(*args, **kwargs), static_argnames=("return_hidden",))


@pytest.fixture(scope="module")
def model():
  return llama.init_decoder(CFG, seed=0)


def _ids(b, t, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(1, CFG.vocab_size, size=(b, t)))


def test_incremental_decoding_with_cache_equals_full_forward(model):
  ids = _ids(2, 11)
  full = run(model, ids)
  cache = model.init_cache(2, 16)
  logits, cache = run(model, ids[:, :5], cache=cache)
  pieces = [logits]
  for i in range(5, 11):
    logits, cache = run(model, ids[:, i:i + 1], cache=cache)
    pieces.append(logits)
  np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, rtol=1e-5, atol=1e-5)
  assert int(cache.index) == 11 and cache.lengths.tolist() == [11, 11]


def test_left_and_right_padding_give_the_same_logits_as_unpadded(model):
  ids = _ids(1, 7, seed=1)
  alone = run(model, ids)
  right = run(model, jnp.pad(ids, ((0, 0), (0, 3))), attention_mask=jnp.arange(10)[None] < 7)
  left = run(model, jnp.pad(ids, ((0, 0), (3, 0))), attention_mask=jnp.arange(10)[None] >= 3)
  np.testing.assert_allclose(right[:, :7], alone, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(left[:, 3:], alone, rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(np.asarray(left)))  # fully masked pad queries stay finite


@pytest.mark.slow
def test_padded_prefill_then_decode_continues_each_row_at_its_length(model):
  a, b = _ids(1, 4, seed=2), _ids(1, 7, seed=3)
  ids = jnp.concatenate([jnp.pad(a, ((0, 0), (0, 3))), b])
  mask = jnp.asarray([[1, 1, 1, 1, 0, 0, 0], [1] * 7], bool)
  cache = model.init_cache(2, 10)
  _, cache = run(model, ids, attention_mask=mask, cache=cache)
  nxt = _ids(2, 1, seed=4)
  logits, cache = run(model, nxt, cache=cache)
  for row, prompt in enumerate((a, b)):
    alone = run(model, jnp.concatenate([prompt, nxt[row:row + 1]], 1))[0, -1]
    np.testing.assert_allclose(logits[row, 0], alone, rtol=1e-5, atol=1e-5)
  assert cache.lengths.tolist() == [5, 8]


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_prefill_into_an_empty_cache_attends_within_itself_as_over_the_whole_cache(model, side):
  """`init_cache`'s cache is `empty`: a prompt written to it attends within itself (the self-attention paths);
  the same cache marked not empty makes it attend over the whole buffer. Same logits, same continuation."""
  ids = _ids(2, 9, seed=6)
  at = jnp.arange(9)[None]
  mask = (at >= jnp.asarray([[3], [0]])) if side == "left" else (at < jnp.asarray([[6], [9]]))
  fresh = model.init_cache(2, 12)
  whole = dataclasses.replace(fresh, empty=False)
  own, own_cache = run(model, ids, attention_mask=mask, cache=fresh)
  over, over_cache = run(model, ids, attention_mask=mask, cache=whole)
  valid = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(own)[valid], np.asarray(over)[valid], rtol=1e-5, atol=1e-5)
  assert fresh.empty and not own_cache.empty and int(own_cache.index) == 9
  scores = lambda cache: re.findall(r"\[[\d,]*9,12\]", str(jax.make_jaxpr(
      lambda m, c: m(ids, attention_mask=mask, cache=c))(model, cache)))  # [..., T, L]: queries over the buffer
  assert scores(whole) and not scores(fresh)
  nxt = _ids(2, 1, seed=7)
  np.testing.assert_allclose(run(model, nxt, cache=own_cache)[0], run(model, nxt, cache=over_cache)[0],
                             rtol=1e-5, atol=1e-5)


def test_sliding_window_limits_attention(model):
  ids = _ids(1, 12, seed=5)
  base = run(model, ids)
  changed = run(model, ids.at[0, 0].set((ids[0, 0] + 1) % CFG.vocab_size))
  # position 11 sees positions 6..11 only (window 6), so token 0 cannot influence it; position 5 can.
  np.testing.assert_allclose(changed[0, 11], base[0, 11], rtol=1e-6, atol=1e-6)
  assert not np.allclose(changed[0, 5], base[0, 5])


def test_remat_gives_same_logits_and_gradients():
  plain = llama.init_decoder(CFG.replace(sliding_window=None), seed=1)
  remat = llama.init_decoder(CFG.replace(sliding_window=None, remat=True), seed=1)
  ids = _ids(2, 8)
  loss = lambda m: jnp.mean(jax.nn.log_softmax(m(ids))[..., 0])
  value_and_grad = jax.jit(jax.value_and_grad(loss))
  (l1, g1), (l2, g2) = value_and_grad(plain), value_and_grad(remat)
  np.testing.assert_allclose(l2, l1, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_bfloat16_compute_stays_close_to_float32():
  f32 = llama.init_decoder(CFG, seed=2)
  bf16 = llama.init_decoder(CFG.replace(dtype="bfloat16"), seed=2)
  ids = _ids(2, 8)
  out = run(bf16, ids)
  assert out.dtype == jnp.float32 and bf16.init_cache(1, 4).k[0].dtype == jnp.bfloat16
  ref = run(f32, ids)
  assert float(jnp.max(jnp.abs(out - ref)) / jnp.max(jnp.abs(ref))) < 0.05


def test_inputs_embeds_path_and_hidden_output(model):
  ids = _ids(2, 6)
  logits, hidden = run(model, inputs_embeds=model.embed(ids), return_hidden=True)
  np.testing.assert_allclose(logits, run(model, ids), rtol=1e-6)
  assert hidden.shape == (2, 6, CFG.hidden_size)
  np.testing.assert_allclose(model.logits(hidden), logits, rtol=1e-6)
  with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
    run(model, ids, inputs_embeds=model.embed(ids))


def test_every_param_has_logical_axes_known_to_the_rules(model):
  mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    axes = var.get_metadata().get("logical_axes")
    assert axes is not None and len(axes) == var.get_value().ndim, path
    sharding.logical_to_spec(axes, var.get_value().shape, mesh)  # raises on a name without a rule
  assert sum(v.get_value().size for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))) == CFG.num_params


def test_hf_config_round_trip_and_errors():
  for cfg in (CFG.replace(model_type="mistral"), CFG.replace(model_type="qwen2", attention_bias=True,
                                                              sliding_window=None),
              CFG.replace(sliding_window=None, tie_word_embeddings=True, rope_theta=5e5, rope_scaling={
                  "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64})):
    assert llama.DecoderConfig.from_hf(cfg.to_hf()) == cfg
  with pytest.raises(ValueError, match="num_kv_heads"):
    llama.DecoderConfig.tiny(num_heads=4, num_kv_heads=3)
  with pytest.raises(ValueError, match="model_type"):
    llama.DecoderConfig.from_hf({"model_type": "gpt2"})


def test_llama3_rope_scaling_matches_reference_formula():
  scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 8192}
  inv = np.asarray(layers.rope_inv_freq(128, 500000.0, scaling))
  base = 1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128)
  wavelen = 2 * np.pi / base
  assert np.allclose(inv[wavelen < 8192 / 4], base[wavelen < 8192 / 4])  # high frequencies kept
  assert np.allclose(inv[wavelen > 8192], base[wavelen > 8192] / 8)  # low frequencies divided by factor
  mid = (wavelen >= 8192 / 4) & (wavelen <= 8192)
  assert mid.any() and np.all((inv[mid] < base[mid]) & (inv[mid] > base[mid] / 8))
