"""KV-cache sampler: greedy/top-k equivalence, per-row EOS, log-probs against a teacher-forced pass, text API."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from jaxagent.models import llama, sampler

CFG = llama.DecoderConfig.tiny(vocab_size=64)
N = 12


@pytest.fixture(scope="module")
def model():
  return llama.init_decoder(CFG, seed=3)


@pytest.fixture(scope="module")
def prompts():
  """Row 0 right-padded (length 4), row 1 left-padded (length 6), row 2 full (length 8)."""
  rng = np.random.default_rng(0)
  ids = rng.integers(3, CFG.vocab_size, size=(3, 8)).astype(np.int32)
  mask = np.ones((3, 8), bool)
  mask[0, 4:] = False
  mask[1, :2] = False
  ids[~mask] = 0
  return jnp.asarray(ids), jnp.asarray(mask)


def _greedy(model, ids, mask, **kwargs):
  return sampler.sample(model, ids, mask, sampler.SamplingConfig(max_new_tokens=N, temperature=0.0, **kwargs))


def _teacher_forced_logprobs(model, ids, mask, out):
  """log_softmax of a plain forward pass over prompt + generated tokens, at each generated token."""
  full = jnp.concatenate([ids, out.tokens], 1)
  gen_mask = jnp.arange(N)[None] < out.lengths[:, None]
  logits = jax.jit(lambda m, x, k: m(x, attention_mask=k))(model, full, jnp.concatenate([mask, gen_mask], 1))
  logp = jax.nn.log_softmax(logits, -1)
  # the token at generated step s is predicted from the previous real token (the prompt's last one for s=0)
  last_prompt = ids.shape[1] - 1 - jnp.argmax(mask[:, ::-1], 1)
  src = jnp.concatenate([last_prompt[:, None], ids.shape[1] + jnp.arange(N - 1)[None].repeat(3, 0)], 1)
  picked = jnp.take_along_axis(logp, src[..., None], 1)
  return jnp.take_along_axis(picked, out.tokens[..., None], 2)[..., 0], gen_mask


@pytest.mark.slow
def test_greedy_rows_match_each_prompt_decoded_alone(model, prompts):
  ids, mask = prompts
  batched = _greedy(model, ids, mask)
  for row in (0, 1):  # the right- and the left-padded row
    alone = _greedy(model, ids[row:row + 1][:, mask[row]], jnp.ones((1, int(mask[row].sum())), bool))
    np.testing.assert_array_equal(batched.tokens[row], alone.tokens[0])
    np.testing.assert_allclose(batched.logprobs[row], alone.logprobs[0], rtol=1e-4, atol=1e-5)
  assert batched.lengths.tolist() == [N] * 3


def test_top_k_1_equals_greedy(model, prompts):
  ids, mask = prompts
  greedy = _greedy(model, ids, mask)
  top1 = sampler.sample(model, ids, mask, sampler.SamplingConfig(max_new_tokens=N, temperature=1.0, top_k=1),
                        rng=jax.random.key(7))
  np.testing.assert_array_equal(top1.tokens, greedy.tokens)
  np.testing.assert_allclose(top1.logprobs, greedy.logprobs, rtol=1e-6)


def test_temperatures_share_one_compilation_and_still_apply(model, prompts):
  """The temperature is traced: a second positive temperature reuses the program, and still changes the draw
  (a near-zero temperature samples the argmax)."""
  ids, mask = prompts
  n = N + 1  # a max_new_tokens no other test compiles
  before = sampler._sample_jit._cache_size()  # pylint: disable=protected-access
  hot = sampler.sample(model, ids, mask, sampler.SamplingConfig(max_new_tokens=n, temperature=5.0),
                       rng=jax.random.key(1))
  after_first = sampler._sample_jit._cache_size()  # pylint: disable=protected-access
  cold = sampler.sample(model, ids, mask, sampler.SamplingConfig(max_new_tokens=n, temperature=1e-4),
                        rng=jax.random.key(1))
  assert sampler._sample_jit._cache_size() == after_first == before + 1  # pylint: disable=protected-access
  greedy = sampler.sample(model, ids, mask, sampler.SamplingConfig(max_new_tokens=n, temperature=0.0))
  np.testing.assert_array_equal(cold.tokens, greedy.tokens)
  assert not np.array_equal(hot.tokens, greedy.tokens)


def test_eos_stops_rows_independently(model, prompts):
  ids, mask = prompts
  free = np.asarray(_greedy(model, ids, mask).tokens)
  # an EOS id that row 0 emits at some step k while row 2 never emits it
  k, eos = next((k, int(t)) for k, t in enumerate(free[0]) if t not in free[2])
  out = _greedy(model, ids, mask, eos_ids=(eos,), pad_id=1)
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  assert lengths[0] == k + 1 and tokens[0, k] == eos
  np.testing.assert_array_equal(tokens[0, :k + 1], free[0, :k + 1])
  assert np.all(tokens[0, k + 1:] == 1) and np.all(np.asarray(out.logprobs)[0, k + 1:] == 0)
  assert lengths[2] == N
  np.testing.assert_array_equal(tokens[2], free[2])
  row1_eos = np.flatnonzero(free[1] == eos)
  assert lengths[1] == (row1_eos[0] + 1 if row1_eos.size else N)


@pytest.mark.slow
def test_logprobs_match_a_teacher_forced_forward_pass(model, prompts):
  ids, mask = prompts
  config = sampler.SamplingConfig(max_new_tokens=N, temperature=0.8, top_p=0.9, top_k=20)
  out = sampler.sample(model, ids, mask, config, rng=jax.random.key(1))
  want, valid = _teacher_forced_logprobs(model, ids, mask, out)
  np.testing.assert_allclose(np.asarray(out.logprobs)[valid], np.asarray(want)[valid], rtol=1e-4, atol=1e-4)
  other = sampler.sample(model, ids, mask, config, rng=jax.random.key(2))
  assert not np.array_equal(other.tokens, out.tokens)  # sampling really samples


def test_prompt_embeds_path_equals_token_path(model, prompts):
  ids, mask = prompts
  config = sampler.SamplingConfig(max_new_tokens=N, temperature=0.0)
  by_ids = sampler.sample(model, ids, mask, config)
  by_embeds = sampler.sample(model, None, mask, config, prompt_embeds=model.embed(ids))
  np.testing.assert_array_equal(by_embeds.tokens, by_ids.tokens)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_padded_decode_row_changes_nothing(model, prompts, temperature):
  """The extra decode row a GPU gets at batch 1 (`decode_pad_rows`) leaves tokens, log-probs, EOS stops and
  sampled draws as they are without it."""
  ids, mask = prompts
  one, one_mask = ids[1:2], mask[1:2]
  config = sampler.SamplingConfig(max_new_tokens=N, temperature=temperature, top_k=20, pad_id=1)
  run = lambda pad, c: sampler.sample(model, one, one_mask, c, rng=jax.random.key(5), pad_rows=pad)
  free = np.asarray(run(0, config).tokens)[0]
  config = dataclasses.replace(config, eos_ids=(int(free[N // 2]),))  # a row that stops half-way
  plain, padded = run(0, config), run(1, config)
  np.testing.assert_array_equal(padded.tokens, plain.tokens)
  np.testing.assert_array_equal(padded.lengths, plain.lengths)
  assert padded.tokens.shape == (1, N) and int(plain.lengths[0]) <= N // 2 + 1
  np.testing.assert_allclose(padded.logprobs, plain.logprobs, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(padded.sample_logprobs, plain.sample_logprobs, rtol=1e-5, atol=1e-6)
  assert sampler.decode_pad_rows(1) == (1 if jax.default_backend() == "gpu" else 0)
  assert sampler.decode_pad_rows(2) == 0


@pytest.mark.parametrize("temperature", [pytest.param(0.0, marks=pytest.mark.slow), 0.9])
def test_rows_prefilled_alone_equal_the_padded_batch(model, prompts, temperature):
  """`sample_rows` (each prompt prefilled at its own width, then one decode) gives the right-padded batch's
  tokens, log-probs, lengths and sampled draws, an EOS stop included."""
  ids, mask = prompts
  ids, mask = np.asarray(ids), np.asarray(mask)
  right = np.zeros_like(ids)
  for r in range(len(ids)):  # the batch right-padded; each row alone at its own length
    right[r, :mask[r].sum()] = ids[r][mask[r]]
  right_mask = np.arange(ids.shape[1])[None] < mask.sum(1)[:, None]
  config = sampler.SamplingConfig(max_new_tokens=N, temperature=temperature, top_k=20, pad_id=1)
  free = np.asarray(sampler.sample(model, right, right_mask, config, rng=jax.random.key(7)).tokens)
  config = dataclasses.replace(config, eos_ids=(int(free[0, N // 2]),))
  batch = sampler.sample(model, right, right_mask, config, rng=jax.random.key(7))
  n = mask.sum(1)
  rows = sampler.sample_rows(model, [right[r:r + 1, :n[r]] for r in range(3)],
                             [right_mask[r:r + 1, :n[r]] for r in range(3)], config, rng=jax.random.key(7))
  np.testing.assert_array_equal(rows.tokens, batch.tokens)
  np.testing.assert_array_equal(rows.lengths, batch.lengths)
  assert int(batch.lengths[0]) <= N // 2 + 1  # the EOS stopped a row early
  np.testing.assert_allclose(rows.logprobs, batch.logprobs, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(rows.sample_logprobs, batch.sample_logprobs, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="row 1's mask has no real token"):
    sampler.sample_rows(model, [right[:1], right[1:2]], [right_mask[:1], np.zeros((1, 8), bool)], config)


@pytest.mark.slow
def test_a_row_continuing_a_cached_prefix_equals_the_whole_prompt(model):
  """`sample_rows` with `prefixes`: a prompt whose first tokens an earlier prompt's row cache holds, prefilled
  from there on, gives the tokens and log-probs of the whole prompt prefilled."""
  rng = np.random.default_rng(1)
  first = rng.integers(3, CFG.vocab_size, size=(1, 12)).astype(np.int32)
  second = np.concatenate([first[:, :9], rng.integers(3, CFG.vocab_size, size=(1, 5)).astype(np.int32)], 1)
  config = sampler.SamplingConfig(max_new_tokens=N, temperature=0.0)
  caches = []
  sampler.sample_rows(model, [first], [np.ones_like(first, bool)], config, row_caches=caches)
  whole = sampler.sample(model, second, np.ones_like(second, bool), config)
  suffix = np.zeros((1, 8), np.int32)
  suffix[0, :5] = second[0, 9:]
  after = sampler.sample_rows(model, [suffix, second], [np.arange(8)[None] < 5, np.ones_like(second, bool)],
                              config, prefixes=[(caches[0], 9), None])
  np.testing.assert_array_equal(after.tokens[0], whole.tokens[0])
  np.testing.assert_array_equal(after.tokens[1], whole.tokens[0])
  np.testing.assert_allclose(after.logprobs[0], whole.logprobs[0], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_filter_logits_top_p_and_top_k():
  logits = jnp.log(jnp.asarray([[0.05, 0.5, 0.15, 0.3]]))
  keep = lambda **kw: np.isfinite(np.asarray(sampler.filter_logits(logits, sampler.SamplingConfig(**kw))))[0]
  assert keep(top_p=0.7).tolist() == [False, True, False, True]  # 0.5 + 0.3 ≥ 0.7
  assert keep(top_p=0.85).tolist() == [False, True, True, True]
  assert keep(top_p=0.4).tolist() == [False, True, False, False]  # the top token is always kept
  assert keep(top_k=3).tolist() == [False, True, True, True]
  draws = jax.vmap(lambda k: jax.random.categorical(
      k, sampler.filter_logits(logits, sampler.SamplingConfig(top_k=2))))(jax.random.split(jax.random.key(0), 500))
  assert set(np.asarray(draws).ravel().tolist()) == {1, 3}


def test_bad_sampling_settings_name_the_field():
  with pytest.raises(ValueError, match="temperature"):
    sampler.SamplingConfig(temperature=-1.0)
  with pytest.raises(ValueError, match="top_p"):
    sampler.SamplingConfig(top_p=0.0)
  with pytest.raises(ValueError, match="at least one real token"):
    sampler.sample(llama.init_decoder(CFG), jnp.zeros((1, 3), jnp.int32), jnp.zeros((1, 3), bool))


def test_truncate_at_stop_cuts_at_the_earliest_stop():
  assert sampler.truncate_at_stop("click [3]\nObservation: x", ["Observation:", "\n"]) == "click [3]"
  assert sampler.truncate_at_stop("no stop here", ["###"]) == "no stop here"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  """A word-level tokenizer built here (no download), saved and reloaded through AutoTokenizer."""
  words = ["<pad>", "<unk>", "</s>"] + [f"w{i}" for i in range(CFG.vocab_size - 3)]
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                              unk_token="<unk>")
  path = tmp_path_factory.mktemp("tokenizer")
  fast.save_pretrained(path)
  return transformers.AutoTokenizer.from_pretrained(path)


@pytest.mark.slow
def test_generate_text_with_eos_and_stop_strings(model, tokenizer):
  prompts = ["w1 w2 w3", "w4 w5 w6 w7 w8 w9"]
  texts = sampler.generate(model, tokenizer, prompts, max_new_tokens=N, temperature=0.0)
  ids = [tokenizer(p)["input_ids"] for p in prompts]
  for prompt_ids, text in zip(ids, texts):
    alone = _greedy(model, jnp.asarray([prompt_ids]), jnp.ones((1, len(prompt_ids)), bool),
                    eos_ids=(tokenizer.eos_token_id,))
    assert text == tokenizer.decode(alone.tokens[0, :alone.lengths[0]].tolist(), skip_special_tokens=True)
  words = texts[1].split()
  stop = words[len(words) // 2]
  cut = sampler.generate(model, tokenizer, prompts[1:], max_new_tokens=N, temperature=0.0, stop=[stop])[0]
  assert cut == texts[1][:texts[1].index(stop)] and stop not in cut
