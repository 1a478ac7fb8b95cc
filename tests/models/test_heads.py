import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxagent.models import heads, llama


def test_last_token_index_handles_both_padding_sides_and_empty_rows():
  mask = jnp.asarray([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 1, 0, 0]], bool)
  assert heads.last_token_index(mask).tolist() == [2, 4, 0, 2]


def test_masked_mean_matches_numpy():
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(3, 6, 4)).astype(np.float32)
  mask = rng.random((3, 6)) > 0.5
  mask[2] = False
  got = np.asarray(heads.masked_mean(jnp.asarray(hidden), jnp.asarray(mask)))
  for row in range(2):
    np.testing.assert_allclose(got[row], hidden[row][mask[row]].mean(0), rtol=1e-6)
  np.testing.assert_array_equal(got[2], 0.0)


@pytest.mark.parametrize("pooling", heads.POOLINGS)
@pytest.mark.slow
def test_value_head_ignores_padding_and_has_the_declared_output(pooling):
  head = heads.ValueHead(8, widths=(16, 16), out_dim=2, pooling=pooling, init_std=0.2, rngs=nnx.Rngs(0))
  hidden = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, 8)), jnp.float32)
  mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
  out = head(hidden, mask)
  assert out.shape == (2, 2)
  noisy = hidden.at[0, 3:].set(100.0)  # only padding changes
  np.testing.assert_allclose(head(noisy, mask)[0], out[0], rtol=1e-6)
  assert not np.allclose(head(noisy, jnp.ones_like(mask))[0], out[0])


@pytest.mark.slow
def test_scalar_head_on_decoder_hidden_states_is_padding_invariant_and_trainable():
  cfg = llama.DecoderConfig.tiny()
  decoder = llama.init_decoder(cfg)
  head = heads.ValueHead(cfg.hidden_size, widths=(32,), out_dim=1, rngs=nnx.Rngs(1))
  ids = jnp.asarray(np.random.default_rng(2).integers(1, cfg.vocab_size, (1, 6)))
  padded = jnp.concatenate([ids, jnp.zeros((1, 3), ids.dtype)], 1)
  mask = jnp.arange(9)[None] < 6

  @jax.jit
  def value(head, ids, mask):
    _, hidden = decoder(ids, attention_mask=mask, return_hidden=True)
    return head(hidden, mask)

  v_alone, v_padded = value(head, ids, jnp.ones((1, 6), bool)), value(head, padded, mask)
  assert v_alone.shape == (1,)
  np.testing.assert_allclose(v_padded, v_alone, rtol=1e-5, atol=1e-6)
  grads = jax.jit(jax.grad(lambda h: jnp.sum(value(h, padded, mask) ** 2)))(head)
  assert all(float(jnp.abs(g).sum()) > 0 for g in jax.tree.leaves(nnx.state(grads, nnx.Param)))


def test_bad_head_settings_name_the_field():
  with pytest.raises(ValueError, match="pooling='max'"):
    heads.ValueHead(4, pooling="max", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="out_dim=3"):
    heads.ValueHead(4, out_dim=3, rngs=nnx.Rngs(0))
