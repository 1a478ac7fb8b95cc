"""`config.model.attention=flash` (`layers.flash_attention`): the plain attention's values and gradients within
float32 rounding under every mask the decoder builds (causal, padding, packed segments, sliding window, GQA), over
several tiles and a length no tile divides; the decoder takes it for its uncached pass only."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import layers, llama, sampler

T = 50  # tiles of 16: three full and one padded


def _qkv(heads, kv_heads, b=3, d=16):
  keys = jax.random.split(jax.random.key(0), 3)
  return (jax.random.normal(keys[0], (b, T, heads, d)), jax.random.normal(keys[1], (b, T, kv_heads, d)),
          jax.random.normal(keys[2], (b, T, kv_heads, d)))


def _mask(kind: str, window=None) -> layers.SelfMask:
  if kind == "segments":  # packed rows, the last with a padded tail
    seg = jnp.array([[1] * 20 + [2] * 25 + [3] * 5, [1] * 10 + [2] * 40, [1] * 7 + [2] * 33 + [0] * 10])
    return layers.SelfMask(seg > 0, layers.segment_positions(seg), seg, window)
  valid = {"causal": jnp.ones((3, T), bool),
           "padding": jnp.array([[True] * T, [True] * 31 + [False] * 19, [False] * 6 + [True] * 44])}[kind]
  return layers.SelfMask(valid, jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0), None, window)


@pytest.mark.parametrize("kind,heads,kv_heads,window", [
    ("causal", 4, 2, None), ("padding", 4, 2, None), ("segments", 4, 2, None),  # GQA
    ("padding", 4, 1, 7), ("segments", 3, 3, 7),  # one key head (MQA), plain MHA; a sliding window
])
@pytest.mark.slow
def test_flash_attention_equals_the_plain_one_in_values_and_gradients(kind, heads, kv_heads, window):
  q, k, v = _qkv(heads, kv_heads)
  mask = _mask(kind, window)
  dense = mask.dense()
  seen = np.asarray(jnp.any(dense[:, 0], -1))[:, :, None, None]  # rows with a visible key (not padding)
  plain = lambda q, k, v: layers.dot_product_attention(q, k, v, dense)
  flash = lambda q, k, v: layers.flash_attention(q, k, v, mask, block=16)
  np.testing.assert_allclose(np.where(seen, flash(q, k, v), 0), np.where(seen, plain(q, k, v), 0), atol=2e-6)
  assert np.isfinite(np.asarray(flash(q, k, v))).all()  # a row with no visible key stays finite
  weights = jax.random.normal(jax.random.key(1), q.shape)
  loss = lambda fn: lambda q, k, v: jnp.sum(jnp.where(seen, fn(q, k, v), 0.0) * weights)
  got = jax.jit(jax.grad(loss(flash), (0, 1, 2)))(q, k, v)
  for g, w in zip(got, jax.grad(loss(plain), (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-5)


def test_one_tile_when_the_sequence_is_shorter_than_a_block():
  q, k, v = _qkv(4, 2)
  mask = _mask("padding")
  seen = np.asarray(jnp.any(mask.dense()[:, 0], -1))[:, :, None, None]
  np.testing.assert_allclose(np.where(seen, layers.flash_attention(q, k, v, mask), 0),
                             np.where(seen, layers.dot_product_attention(q, k, v, mask.dense()), 0), atol=2e-6)


@pytest.mark.slow
def test_a_mask_tile_is_the_dense_mask_cut():
  mask = _mask("segments", window=9).padded(64)
  dense = np.asarray(mask.dense()[:, 0])
  np.testing.assert_array_equal(mask.block(jnp.int32(32), jnp.int32(16), 16), dense[:, 32:48, 16:32])
  assert not dense[:, T:].any() and not dense[:, :, T:].any()  # the padded tokens are nobody's keys


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.slow
def test_the_decoder_with_flash_gives_the_logits_and_gradients_of_xla(packed, monkeypatch):
  monkeypatch.setattr(layers, "FLASH_BLOCK", 16)  # several tiles at this length
  cfg = llama.DecoderConfig.tiny(sliding_window=24)
  ours, flash = llama.init_decoder(cfg, 0), llama.init_decoder(dataclasses.replace(cfg, attention="flash"), 0)
  ids = jax.random.randint(jax.random.key(1), (2, 40), 0, cfg.vocab_size)
  if packed:
    seg = jnp.array([[1] * 15 + [2] * 25, [1] * 30 + [0] * 10])
    kwargs, keep = {"segment_ids": seg}, seg > 0
  else:
    keep = jnp.array([[True] * 40, [True] * 29 + [False] * 11])
    kwargs = {"attention_mask": keep}

  def loss(model):
    return jnp.sum(jnp.where(keep[..., None], jax.nn.log_softmax(model(ids, **kwargs)), 0.0)) / 1e3

  np.testing.assert_allclose(np.asarray(flash(ids, **kwargs))[keep], np.asarray(ours(ids, **kwargs))[keep], atol=1e-5)
  from flax import nnx  # pylint: disable=g-import-not-at-top
  grads = [nnx.state(nnx.grad(loss)(m), nnx.Param) for m in (ours, flash)]
  for g, w in zip(jax.tree.leaves(grads[1]), jax.tree.leaves(grads[0])):
    np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-4)


@pytest.mark.slow
def test_the_decoder_decodes_with_its_cache_as_before():
  cfg = llama.DecoderConfig.tiny()
  ours, flash = llama.init_decoder(cfg, 0), llama.init_decoder(dataclasses.replace(cfg, attention="flash"), 0)
  ids = jax.random.randint(jax.random.key(1), (2, 10), 0, cfg.vocab_size)
  mask = jnp.array([[True] * 10, [True] * 6 + [False] * 4])
  config = sampler.SamplingConfig(max_new_tokens=4, temperature=0.0)
  np.testing.assert_array_equal(np.asarray(sampler.sample(flash, ids, mask, config).tokens),
                                np.asarray(sampler.sample(ours, ids, mask, config).tokens))
