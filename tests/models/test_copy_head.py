"""The copy head (`llama.CopyHead`): a distribution, the same through every path a decoder is run by (cache, packed
rows, the sampler's row prefill, a Hugging Face directory), and a pointer that does copy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxagent.models import llama, sampler
from jaxagent.models.hf import llama as hf_llama

CFG = llama.DecoderConfig.tiny(copy_head=8, copy_top_k=4)
run = jax.jit(lambda m, *args, **kwargs: m(*args, **kwargs))


@pytest.fixture(scope="module")
def model():
  return llama.init_decoder(CFG, seed=0)


def _ids(b, t, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(1, CFG.vocab_size, size=(b, t)))


@pytest.mark.slow
def test_the_output_is_a_distribution_whose_copy_part_sits_on_the_input_tokens(model):
  ids = _ids(2, 9)
  logp = run(model, ids)
  np.testing.assert_allclose(jax.nn.logsumexp(logp, -1), 0.0, atol=1e-5)
  hidden, _ = model.hidden_states(ids)
  assert hidden.shape == (2, 9, CFG.hidden_size + 1 + 2 * CFG.copy_top_k)
  tokens = np.asarray(hidden[..., CFG.hidden_size + 1 + CFG.copy_top_k:]).astype(int)
  weights = np.asarray(hidden[..., CFG.hidden_size + 1:CFG.hidden_size + 1 + CFG.copy_top_k])
  for b in range(2):
    for t in range(1, 9):  # each query's kept keys hold tokens at or before it (the first queries see < K keys)
      kept = set(tokens[b, t][weights[b, t] > 1e-6])
      assert kept <= set(np.asarray(ids[b, :t + 1]).tolist())
  # the gate shut: the vocabulary's distribution alone
  shut = llama.init_decoder(CFG, seed=0)
  shut.copy_head.gate.bias.set_value(jnp.full((1,), 30.0))
  plain = llama.init_decoder(CFG.replace(copy_head=0), seed=0)
  np.testing.assert_allclose(run(shut, ids), jax.nn.log_softmax(run(plain, ids), -1), atol=1e-4)


def test_a_slots_key_is_read_off_the_valid_slot_before_it():
  keys = jnp.arange(6, dtype=jnp.float32)[None, :, None] * jnp.ones((1, 1, 2))
  valid = jnp.asarray([[True, True, False, False, True, True]])  # a hole where a padded row's prompt ends
  shifted = llama.CopyHead.previous_keys(keys, valid)
  np.testing.assert_array_equal(shifted[0, :, 0], [0, 0, 1, 1, 1, 4])


@pytest.mark.slow
def test_a_rows_first_token_is_never_copied(model):
  ids = _ids(1, 6, seed=5)
  hidden, _ = model.hidden_states(ids)
  weights = np.asarray(hidden[0, :, CFG.hidden_size + 1:CFG.hidden_size + 1 + CFG.copy_top_k])
  tokens = np.asarray(hidden[0, :, CFG.hidden_size + 1 + CFG.copy_top_k:]).astype(int)
  assert weights[0].sum() < 1e-6  # the first query's only key is the first token
  for t in range(1, 6):  # each later query's weight lies on tokens after the first
    assert set(tokens[t][weights[t] > 1e-6]) <= set(np.asarray(ids[0, 1:t + 1]).tolist())


@pytest.mark.slow
def test_decoding_with_a_cache_and_a_prefill_equal_the_whole_forward(model):
  ids = _ids(2, 11, seed=1)
  full = run(model, ids)
  cache = model.init_cache(2, 16)
  logits, cache = run(model, ids[:, :5], cache=cache)  # a prefill: within its input
  pieces = [logits]
  for i in range(5, 11):
    logits, cache = run(model, ids[:, i:i + 1], cache=cache)
    pieces.append(logits)
  np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(cache.tokens[:, :11], ids)


@pytest.mark.slow
def test_packed_rows_give_each_sample_its_own_pointer(model):
  a, b = _ids(1, 6, seed=2), _ids(1, 5, seed=3)
  packed = jnp.concatenate([a, b], 1)
  segments = jnp.asarray([[1] * 6 + [2] * 5])
  logp = run(model, packed, segment_ids=segments)
  np.testing.assert_allclose(logp[:, :6], run(model, a), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(logp[:, 6:], run(model, b), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_the_row_prefill_samples_what_the_padded_batch_does(model):
  rows = [np.asarray(_ids(1, n, seed=10 + n)) for n in (7, 12)]
  masks = [np.ones_like(r, bool) for r in rows]
  config = sampler.SamplingConfig(max_new_tokens=6, temperature=0.0)
  by_rows = sampler.sample_rows(model, rows, masks, config)
  ids = np.zeros((2, 12), np.int32)
  mask = np.zeros((2, 12), bool)
  for i, r in enumerate(rows):
    ids[i, :r.shape[1]], mask[i, :r.shape[1]] = r[0], True
  padded = sampler.sample(model, jnp.asarray(ids), jnp.asarray(mask), config)
  np.testing.assert_array_equal(by_rows.tokens, padded.tokens)
  np.testing.assert_allclose(by_rows.logprobs, padded.logprobs, atol=1e-4)


@pytest.mark.slow
def test_a_hugging_face_directory_keeps_the_head(model, tmp_path):
  hf_llama.save_pretrained(model, CFG, str(tmp_path))
  loaded, cfg = hf_llama.load_pretrained(str(tmp_path))
  assert (cfg.copy_head, cfg.copy_top_k) == (8, 4)
  ids = _ids(1, 7, seed=4)
  np.testing.assert_allclose(run(loaded, ids), run(model, ids), rtol=1e-5, atol=1e-5)
  assert CFG.num_params == sum(x.size for x in jax.tree.leaves(nnx.state(model)))


def test_the_config_refuses_a_negative_width():
  with pytest.raises(ValueError, match="copy_head=-1"):
    llama.DecoderConfig.tiny(copy_head=-1)
  with pytest.raises(ValueError, match="copy_top_k=0"):
    llama.DecoderConfig.tiny(copy_head=4, copy_top_k=0)


def test_the_head_needs_token_ids(model):
  with pytest.raises(ValueError, match="copy head"):
    model.hidden_states(inputs_embeds=jnp.zeros((1, 3, CFG.hidden_size)))
