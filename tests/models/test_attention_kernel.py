"""`config.model.attention`: the fused path (`layers.fused_causal_attention`, cuDNN's kernel on a GPU) keeps
`layers.dot_product_attention`'s contract (GQA, padding, sliding window), the decoder takes it only for its
uncached pass, and a bad value or combination is refused before any work, naming the key.

cuDNN itself needs a GPU; here its wrapper runs with `jax.nn.dot_product_attention`'s XLA implementation, which
shares the mask handling. `benchmarks/accelerator.py` checks the cuDNN kernel's output against ours on a GPU."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import digirl as digirl_config
from jaxagent import models
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.models import layers, llama, sampler
from jaxagent.pipeline.config import ConfigError, validate
from jaxagent.recipes import digirl


def _qkv(b=3, t=12, heads=4, kv_heads=2, d=16, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(0), 3)
  return (jax.random.normal(keys[0], (b, t, heads, d), dtype), jax.random.normal(keys[1], (b, t, kv_heads, d), dtype),
          jax.random.normal(keys[2], (b, t, kv_heads, d), dtype))


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.slow
def test_the_fused_path_keeps_the_contract_of_ours_with_padding_and_a_window(window):
  q, k, v = _qkv()
  valid = jnp.array([[True] * 12, [True] * 7 + [False] * 5, [False] * 3 + [True] * 9])  # full, right-, left-padded
  slots = jnp.broadcast_to(jnp.arange(12), (3, 12))
  positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
  mask = layers.attention_mask(slots, slots, valid, positions, positions, window)
  want = layers.dot_product_attention(q, k, v, mask)
  got = layers.fused_causal_attention(q, k, v, mask, implementation="xla")
  real = np.asarray(valid)[:, :, None, None] & np.asarray(jnp.any(mask[:, 0], -1))[:, :, None, None]
  np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), atol=1e-5)
  assert np.isfinite(np.asarray(got)).all()  # a query with no visible key (left padding) stays finite


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.slow
def test_query_blocks_against_their_key_prefix_give_the_full_attention_and_its_gradients(window):
  t = 150  # blocks of 64, 64 and 22 rows
  q, k, v = _qkv(t=t)
  valid = jnp.array([[True] * t, [True] * 100 + [False] * 50, [False] * 7 + [True] * 143])
  slots = jnp.broadcast_to(jnp.arange(t), (3, t))
  positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
  mask = layers.attention_mask(slots, slots, valid, positions, positions, window)
  real = np.asarray(jnp.any(mask[:, 0], -1))[:, :, None, None]  # rows with a visible key (not left padding)

  def loss(fn):
    return lambda q, k, v: jnp.sum(jnp.where(real, fn(q, k, v, mask), 0.0) ** 2)

  want = layers.dot_product_attention(q, k, v, mask)
  got = layers.causal_block_attention(q, k, v, mask)
  np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), atol=1e-5)
  for g, w in zip(jax.grad(loss(layers.causal_block_attention), (0, 1, 2))(q, k, v),
                  jax.grad(loss(layers.dot_product_attention), (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(g, w, atol=1e-4)
  short = _qkv(t=12)  # one block: the plain path
  short_mask = layers.attention_mask(slots[:, :12], slots[:, :12], valid[:, :12])
  np.testing.assert_array_equal(layers.causal_block_attention(*short, short_mask),
                                layers.dot_product_attention(*short, short_mask))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_query_blocks_over_a_cache_give_the_full_attention(dtype):
  """A prompt prefilled after cached keys (`serving.prefix_cache`): its T = 150 queries at slots 40-189 of a
  cache of S = 256 (keys at 0-39 kept, the slots after the input empty), in blocks against the keys up to each
  block's last slot, equal the attention over the whole cache; a row's left padding and a shorter row included."""
  b, t, s, start = 3, 150, 256, 40
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (b, t, 4, 16), dtype)
  k, v = (jax.random.normal(x, (b, s, 2, 16), dtype) for x in keys[1:])
  q_valid = jnp.array([[True] * t, [True] * 90 + [False] * 60, [False] * 5 + [True] * 145])
  k_valid = jnp.zeros((b, s), bool).at[:, :start].set(True).at[:, start:start + t].set(q_valid)
  k_positions = jnp.cumsum(k_valid, axis=1) - 1
  q_slots = jnp.broadcast_to(start + jnp.arange(t), (b, t))
  k_slots = jnp.broadcast_to(jnp.arange(s), (b, s))
  mask = layers.attention_mask(q_slots, k_slots, k_valid, k_positions[:, start:start + t], k_positions)
  real = np.asarray(q_valid)[:, :, None, None]
  got = jax.jit(layers.causal_block_attention)(q, k, v, mask)  # blocks of 64, 64 and 22 rows
  want = layers.dot_product_attention(q, k, v, mask)
  atol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.where(real, got.astype(jnp.float32), 0), np.where(real, want.astype(jnp.float32), 0),
                             atol=atol)
  with pytest.raises(ValueError, match="150 queries over 100 keys"):
    layers.causal_block_attention(q, k[:, :100], v[:, :100], mask[..., :100])


@pytest.mark.parametrize("t", [150, 12])
@pytest.mark.slow
def test_query_blocks_in_bfloat16_on_cpu_run_their_backward_in_bfloat16(t):
  """`causal_block_attention` in bfloat16 on CPU (its own backward: every product on bfloat16 operands, the key and
  value gradients summed in float32 block by block) gives float32 attention's values and gradients within bfloat16
  rounding, with padding; and every product of its compiled gradient runs in XLA:CPU's library in bfloat16."""
  from test_dense import _compiled_products  # pylint: disable=g-import-not-at-top
  q, k, v = _qkv(t=t)  # blocks of 64, 64 and 22 rows; one block
  valid = jnp.array([[True] * t, [True] * (t * 2 // 3) + [False] * (t - t * 2 // 3), [False] * 7 + [True] * (t - 7)])
  slots = jnp.broadcast_to(jnp.arange(t), (3, t))
  positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
  mask = layers.attention_mask(slots, slots, valid, positions, positions)
  real = np.asarray(jnp.any(mask[:, 0], -1))[:, :, None, None]
  weights = jax.random.normal(jax.random.key(1), q.shape)

  def loss(fn, dtype):
    def f(q, k, v):
      out = fn(q.astype(dtype), k.astype(dtype), v.astype(dtype), mask).astype(jnp.float32)
      return jnp.sum(jnp.where(real, out * weights, 0.0))
    return f

  got = jax.jit(jax.value_and_grad(loss(layers.causal_block_attention, jnp.bfloat16), (0, 1, 2)))
  want = jax.value_and_grad(loss(layers.dot_product_attention, jnp.float32), (0, 1, 2))(q, k, v)
  (value, grads), (want_value, want_grads) = got(q, k, v), want
  assert abs(float(value - want_value)) < 0.02 * float(jnp.sum(jnp.abs(weights)))
  for g, w in zip(grads, want_grads):
    assert float(jnp.linalg.norm(g - w) / jnp.linalg.norm(w)) < 0.02
  products = _compiled_products(got.lower(q, k, v).compile().as_text())
  assert len(products) == (3 if t > 64 else 1) * (2 + 4), products  # per block: 2 forward, 4 backward
  assert all(ynn and types == ("bf16", "bf16") for ynn, types in products), products


def _routed(monkeypatch):
  calls, original = [], layers.fused_causal_attention

  def fused(q, k, v, mask, implementation="cudnn"):
    calls.append(implementation)
    return original(q, k, v, mask, implementation="xla")

  monkeypatch.setattr(layers, "fused_causal_attention", fused)
  return calls


@pytest.mark.slow
def test_the_decoder_takes_the_fused_path_for_a_prompt_and_never_over_a_cache(monkeypatch):
  calls = _routed(monkeypatch)
  cfg = llama.DecoderConfig.tiny(dtype="bfloat16")
  ours, fused = llama.init_decoder(cfg, 0), llama.init_decoder(dataclasses.replace(cfg, attention="cudnn"), 0)
  ids = jax.random.randint(jax.random.key(1), (2, 10), 0, cfg.vocab_size)
  mask = jnp.array([[True] * 10, [True] * 6 + [False] * 4])
  want, got = ours(ids, attention_mask=mask), fused(ids, attention_mask=mask)
  assert calls == ["cudnn"] * cfg.num_layers  # each layer asked for cuDNN
  np.testing.assert_allclose(np.asarray(got, np.float32)[mask], np.asarray(want, np.float32)[mask], atol=2e-2)
  calls.clear()
  config = sampler.SamplingConfig(max_new_tokens=4, temperature=0.0)
  a = sampler.sample(fused, ids, mask, config).tokens
  # the prefill attends within its prompt (the fused kernel, once a layer); each decoded token reads the cache (XLA)
  assert calls == ["cudnn"] * cfg.num_layers
  np.testing.assert_array_equal(np.asarray(a), np.asarray(sampler.sample(ours, ids, mask, config).tokens))


def test_decoder_config_refuses_an_unknown_kernel_or_float32_with_cudnn():
  with pytest.raises(ValueError, match=r"attention='sdpa' is not one of \('xla', 'flash', 'cudnn'\)"):
    llama.DecoderConfig.tiny(attention="sdpa")
  with pytest.raises(ValueError, match=r"attention='cudnn' runs in bfloat16 or float16, but dtype='float32'"):
    llama.DecoderConfig.tiny(attention="cudnn")


def _config(kind="decoder", **model):
  config = digirl_config.get_config("smoke")
  config.model.kind = kind
  config.model.update(model)
  return config


@pytest.mark.parametrize("model,needle", [
    (dict(attention="sdpa"), r"config\.model\.attention='sdpa' is not one of \('xla', 'flash', 'cudnn'\)"),
    (dict(attention="cudnn"), r"config\.model\.attention='cudnn' computes in bfloat16 or float16 but "
                              r"config\.model\.dtype='float32'; set --config\.model\.dtype=bfloat16"),
    (dict(attention="cudnn", dtype="bfloat16", kind="autoui"), r"config\.model\.attention='cudnn' is wired for "
                                                                r"Llama-family decoders"),
])
def test_a_bad_attention_value_is_refused_before_any_work_naming_the_key(model, needle):
  with pytest.raises(ConfigError, match=needle):
    validate(_config(**{"kind": "vlm", **model}), digirl.CHOICES, {})


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the refusal is for machines without a GPU")
def test_building_with_cudnn_without_a_gpu_is_refused_naming_the_key():
  with pytest.raises(ValueError, match=r"config\.model\.attention='cudnn' needs a GPU; this machine's JAX backend "
                                       r"is 'cpu'; set --config\.model\.attention=xla"):
    models.build(_config(attention="cudnn", dtype="bfloat16"), load_tokenizer(None))


@pytest.mark.parametrize("kind", ["decoder", "vlm"])
def test_the_default_builds_the_xla_kernel(kind):
  model = nnx.eval_shape(models.build(_config(kind), load_tokenizer(None)).init)
  assert (model.config if kind == "decoder" else model.config.text).attention == "xla"
