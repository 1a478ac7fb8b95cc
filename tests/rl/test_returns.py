"""mc_return: the reverse-scan discounted return against its definition and DigiRL's matrix form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.rl.returns import mc_return


def _matrix_form(rewards, gamma):
  """DigiRL `env_utils.add_mc_return` (reference/algorithms.md §4.6), verbatim in numpy."""
  r = np.asarray(rewards, np.float64).reshape(1, -1)
  gamma_row = np.cumprod(np.ones((1, r.shape[1])) * gamma)
  gamma_matrix = np.triu(gamma_row.reshape(1, -1) / gamma_row.reshape(-1, 1))
  return np.sum(r * gamma_matrix, axis=1)


def test_matches_digirl_matrix_form_and_terminal_success_closed_form():
  rng = np.random.default_rng(0)
  rewards = rng.normal(size=7)
  np.testing.assert_allclose(mc_return(rewards, 0.9), _matrix_form(rewards, 0.9), rtol=1e-5)
  sparse = np.array([0, 0, 0, 1.0])  # DigiRL: only the terminal success step has r=1 -> G_t = γ^(T-1-t)
  np.testing.assert_allclose(mc_return(sparse, 0.5), [0.125, 0.25, 0.5, 1.0])


def test_batched_numpy_and_jitted_jax_agree():
  rewards = np.random.default_rng(1).normal(size=(3, 5)).astype(np.float32)
  expected = np.stack([_matrix_form(r, 0.95) for r in rewards])
  np.testing.assert_allclose(mc_return(rewards, 0.95), expected, rtol=1e-5)
  out = jax.jit(lambda r: mc_return(r, 0.95))(jnp.asarray(rewards))
  assert isinstance(out, jax.Array)
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5)


def test_rejects_gamma_outside_unit_interval():
  with pytest.raises(ValueError, match="gamma=1.5"):
    mc_return([1.0], 1.5)
