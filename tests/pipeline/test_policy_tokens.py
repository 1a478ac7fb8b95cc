"""Token in, token out: a policy's replies carry the ids it read and wrote and their sampling-time log-probs, which
equal a re-scoring of the same tokens; weights handed over in memory change the replies without a recompilation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxagent import types
from jaxagent.models import sampler
from jaxagent.pipeline.policy import ModelPolicy
from jaxagent.serving.checkpoint import random_policy


@pytest.fixture(scope="module")
def loaded():
  return random_policy("decoder", num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128)


def _rescore(model, prompt_ids, reply_ids, temperature):
  ids = jnp.asarray([list(prompt_ids) + list(reply_ids)], jnp.int32)
  logits = model(ids, attention_mask=jnp.ones_like(ids, bool))[0].astype(jnp.float32) / temperature
  logp = jax.nn.log_softmax(logits, -1)
  n = len(prompt_ids)
  return np.asarray([logp[n - 1 + i, t] for i, t in enumerate(reply_ids)])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.slow
def test_sampling_time_logprobs_equal_a_rescoring_of_the_same_tokens(loaded, temperature):
  policy = ModelPolicy(loaded, "webrl", temperature=temperature, max_tokens=24, seed=3)
  replies = policy.generate([("Click the button", []), ("Type your name into the box please", [])])
  for reply in replies:
    assert isinstance(reply, types.Sample) and len(reply.reply_ids) == len(reply.logprobs) > 0
    assert reply.prompt_ids == loaded.tokenizer("Click the button" if reply is replies[0] else
                                                "Type your name into the box please")["input_ids"]
    assert loaded.tokenizer.decode(reply.reply_ids, skip_special_tokens=True).strip() == str(reply)
    np.testing.assert_allclose(reply.logprobs, _rescore(loaded.model, reply.prompt_ids, reply.reply_ids,
                                                        temperature), atol=1e-4)


@pytest.mark.slow
def test_sample_logprobs_are_zero_when_greedy_and_the_temperature_one_logprobs_otherwise(loaded):
  ids = jnp.asarray(loaded.tokenizer("hello there")["input_ids"], jnp.int32)[None]
  mask = jnp.ones_like(ids, bool)
  greedy = sampler.sample(loaded.model, ids, mask, sampler.SamplingConfig(max_new_tokens=8, temperature=0.0))
  assert float(jnp.abs(greedy.sample_logprobs).max()) == 0.0 and float(greedy.logprobs[0, 0]) < 0
  t1 = sampler.sample(loaded.model, ids, mask, sampler.SamplingConfig(max_new_tokens=8), rng=jax.random.key(1))
  np.testing.assert_allclose(t1.sample_logprobs, t1.logprobs, atol=1e-6)


@pytest.mark.slow
def test_weights_in_memory_change_the_replies_without_recompiling(loaded):
  policy = ModelPolicy(loaded, "webrl", temperature=0.0, max_tokens=16)
  before = policy.generate([("hello", [])])[0]
  compiled = sampler._sample_jit._cache_size()  # pylint: disable=protected-access
  other = random_policy("decoder", seed=1, num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128)
  original = jax.tree.map(jnp.copy, nnx.state(loaded.model))
  try:
    policy.set_weights(nnx.state(other.model))
    after = policy.generate([("hello", [])])[0]
    assert sampler._sample_jit._cache_size() == compiled  # pylint: disable=protected-access
    assert after.reply_ids != before.reply_ids
    ids = jnp.asarray([after.prompt_ids + after.reply_ids[:-1]], jnp.int32)  # greedy under the new weights
    argmax = jnp.argmax(other.model(ids, attention_mask=jnp.ones_like(ids, bool))[0], -1)
    assert argmax[len(after.prompt_ids) - 1:].tolist() == after.reply_ids
    # the handed-over arrays are copies: deleting the learner's does not break the policy
    jax.tree.map(lambda x: x.delete(), nnx.state(other.model))
    assert policy.generate([("hello", [])])[0].reply_ids == after.reply_ids
  finally:
    policy.set_weights(original)


@pytest.mark.slow
@pytest.mark.parametrize("as_host", [False, True], ids=["learner_mesh", "host_values"])
def test_weights_from_another_mesh_are_placed_as_the_policys_own(loaded, as_host):
  """A learner's arrays span its mesh (here 8 devices; under `jax.distributed`, other processes' too, handed over
  as host values): the policy keeps acting on its own device, with the same program, on the new values."""
  policy = ModelPolicy(loaded, "webrl", temperature=0.0, max_tokens=16)
  policy.generate([("hello", [])])
  compiled = sampler._sample_jit._cache_size()  # pylint: disable=protected-access
  placement = [(x.sharding, x.committed) for x in jax.tree.leaves(nnx.state(loaded.model))]
  other = random_policy("decoder", seed=2, num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128)
  mesh = jax.make_mesh((len(jax.devices()),), ("data",))
  learner = jax.device_put(nnx.state(other.model), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  assert len(jax.devices()) > 1 and all(len(x.devices()) > 1 for x in jax.tree.leaves(learner))
  original = jax.tree.map(jnp.copy, nnx.state(loaded.model))
  try:
    policy.set_weights(jax.tree.map(np.asarray, learner) if as_host else learner)
    assert [(x.sharding, x.committed) for x in jax.tree.leaves(nnx.state(loaded.model))] == placement
    for got, want in zip(jax.tree.leaves(nnx.state(loaded.model)), jax.tree.leaves(nnx.state(other.model))):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    reply = policy.generate([("hello", [])])[0]
    assert sampler._sample_jit._cache_size() == compiled  # pylint: disable=protected-access
    assert reply.reply_ids == ModelPolicy(other, "webrl", temperature=0.0, max_tokens=16).generate(
        [("hello", [])])[0].reply_ids
  finally:
    policy.set_weights(original)
