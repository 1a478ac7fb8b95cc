"""`Engine` batching details that the HTTP tests do not see: the prompt width and decode budget each sampler call
compiles."""

import numpy as np
import pytest

from jaxagent.serving import engine as engine_lib
from jaxagent.serving.checkpoint import random_policy
from jaxagent.serving.prefix_cache import common_prefix


def test_decode_budget_is_the_request_rounded_up_to_32_tokens():
  assert [engine_lib._decode_bucket(n) for n in (1, 32, 33, 133, 160, 161)] == [32, 32, 64, 160, 160, 192]
  # An untrained decoder rarely emits EOS at temperature 2: the row runs to the request's limit, and the sampler
  # call was compiled for 160 new tokens (a power-of-two budget would have decoded 256).
  eng = engine_lib.Engine(random_policy("decoder", num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128),
                          max_batch=2, max_new_tokens=160)
  out = eng.generate([engine_lib.GenerationRequest(prompt="hello", max_tokens=160, temperature=2.0)])[0]
  assert out.completion_tokens <= 160
  assert {shape[2] for shape in eng._shapes} == {160}  # pylint: disable=protected-access


def test_prompt_width_is_a_quarter_octave_above_512_tokens():
  widths = [engine_lib.prompt_bucket(n) for n in range(1, 8193)]
  assert widths[:64] == [64] * 64 and engine_lib.prompt_bucket(2666) == 3072
  assert all(w >= n and w % 64 == 0 for n, w in enumerate(widths, 1))
  assert all(w <= 1.25 * n for n, w in enumerate(widths, 1) if n > 512)  # a power of two pads up to 2x
  for octave in (1024, 2048, 4096):  # four compiled widths an octave
    assert len({engine_lib.prompt_bucket(n) for n in range(octave + 1, 2 * octave + 1)}) == 4
  eng = engine_lib.Engine(random_policy("decoder", num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128),
                          max_batch=1, max_new_tokens=8)
  out = eng.generate([engine_lib.GenerationRequest(prompt="x " * 300, max_tokens=8, temperature=0.0)])[0]
  widths = {shape[1] for shape in eng._shapes}  # pylint: disable=protected-access
  assert out.prompt_tokens > 512 and widths == {engine_lib.prompt_bucket(out.prompt_tokens)}


@pytest.mark.slow
def test_long_prompts_of_different_widths_are_prefilled_a_row_at_a_time():
  """A decoder batch of long prompts of different widths takes `sampler.sample_rows` by default, with the padded
  batch's tokens and sampled log-probs; short prompts, and `prefill="batch"`, keep one padded prefill."""
  policy = random_policy("decoder", num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128)
  requests = [engine_lib.GenerationRequest(prompt="x " * n, max_tokens=8, temperature=t)
              for n in (300, 100, 500) for t in (0.0, 1.0)]
  results = {}
  for mode in engine_lib.PREFILL_MODES:
    eng = engine_lib.Engine(policy, max_batch=4, max_new_tokens=8, prefill=mode)
    results[mode] = eng.generate(requests)
    assert eng.stats().get("row_prefilled_batches", 0) == (2 if mode == "rows" else 0)  # one per temperature
  for rows, batch in zip(results["rows"], results["batch"]):
    assert rows.tokens == batch.tokens
    np.testing.assert_allclose(rows.sample_logprobs, batch.sample_logprobs, rtol=1e-4, atol=1e-5)
  eng = engine_lib.Engine(policy, max_batch=4, max_new_tokens=8)
  eng.generate([engine_lib.GenerationRequest(prompt="x " * n, max_tokens=8) for n in (20, 200)])
  assert "row_prefilled_batches" not in eng.stats()
  with pytest.raises(ValueError, match="Engine.prefill='rowwise'"):
    engine_lib.Engine(policy, prefill="rowwise")


def test_a_cached_prefix_is_cut_so_that_the_row_is_no_wider_than_the_prompt_alone():
  """The rest of a prompt is padded to its own width; the keys kept before it may not widen the row past the
  width the whole prompt takes alone (1,792 for 1,750 tokens): what they would widen it by is prefilled instead,
  within the padding the rest has anyway."""
  cache = object()
  assert engine_lib.fit_prefix((cache, 450), 1750) == (cache, 1792 - 1536)  # the rest, 1,300, pads to 1,536
  assert engine_lib.fit_prefix((cache, 300), 400) == (cache, 300)  # 300 + 128 slots: within 448
  assert engine_lib.fit_prefix((cache, 100), 1750) is None  # the rest pads to 1,792: nothing left to skip
  assert engine_lib.fit_prefix(None, 1750) is None


@pytest.mark.slow
def test_an_episodes_next_prompt_prefills_only_what_follows_the_cached_one():
  """A prompt that begins as an earlier one did is prefilled from where they differ (the prefix cache), with the
  replies of a whole prefill; new weights empty the cache."""
  policy = random_policy("decoder", num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128)
  step = lambda t, page: engine_lib.GenerationRequest(prompt="intent " * 40 + "done " * t + page, max_tokens=8,
                                                      temperature=0.0)
  cached = engine_lib.Engine(policy, max_batch=2, max_new_tokens=8, prefix_cache_bytes=1 << 30)
  plain = engine_lib.Engine(policy, max_batch=2, max_new_tokens=8, prefill="batch")
  steps = [[step(t, p) for p in pages] for t, pages in enumerate((("page a " * 150, "page b " * 10),
                                                                   ("page c " * 120, "page d " * 40)))]
  for requests in steps:
    assert [r.tokens for r in cached.generate(requests)] == [r.tokens for r in plain.generate(requests)]
  ids = [[np.asarray(cached.prepare(r).ids) for r in requests] for requests in steps]
  shared = [max(common_prefix(now, before) for before in ids[0]) for now in ids[1]]
  skipped = [engine_lib.fit_prefix((None, n), len(now)) for n, now in zip(shared, ids[1])]
  assert min(shared) >= 150 and skipped[0] is not None  # each row of step 2 continues step 1's intent
  assert cached.stats()["prefix_tokens_reused"] == sum(s[1] for s in skipped if s)
  assert cached.stats()["row_prefilled_batches"] == 2
  reused = cached.stats()["prefix_tokens_reused"]
  nnx_state = engine_lib.nnx.state(policy.model)
  engine_lib.nnx.update(policy.model, engine_lib.jax.tree.map(lambda x: x * 1.0, nnx_state))  # new arrays
  cached.generate([step(1, "page c " * 120)])
  assert cached.stats()["prefix_tokens_reused"] == reused
