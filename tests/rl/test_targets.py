"""Polyak target updates against hand-computed values, on plain pytrees and on an nnx State."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxagent.models import critic as critic_lib
from jaxagent.rl import targets


def test_polyak_update_hand_computed():
  target = {"a": jnp.array([1.0, 2.0]), "b": jnp.array(4.0)}
  online = {"a": jnp.array([3.0, 6.0]), "b": jnp.array(0.0)}
  new = targets.polyak_update(target, online, 0.1)
  # (1 - 0.1) * target + 0.1 * online
  np.testing.assert_allclose(new["a"], [1.2, 2.4], rtol=1e-6)
  np.testing.assert_allclose(new["b"], 3.6, rtol=1e-6)
  np.testing.assert_allclose(target["a"], [1.0, 2.0])  # pure: the input is untouched


def test_polyak_update_limits_and_repeated_updates():
  target = {"w": jnp.array([10.0])}
  online = {"w": jnp.array([0.0])}
  np.testing.assert_allclose(targets.polyak_update(target, online, 1.0)["w"], [0.0])
  np.testing.assert_allclose(targets.polyak_update(target, online, 0.0)["w"], [10.0])
  t = target
  for _ in range(3):
    t = targets.polyak_update(t, online, targets.DIGIQ_TAU)
  np.testing.assert_allclose(t["w"], [10.0 * 0.9 ** 3], rtol=1e-6)  # 7.29
  with pytest.raises(ValueError, match="tau"):
    targets.polyak_update(target, online, 1.5)


def test_polyak_update_on_nnx_state_keeps_metadata_and_jits():
  online = nnx.state(critic_lib.MLPHead(3, (4,), 1, rngs=nnx.Rngs(0)), nnx.Param)  # a critic head
  target = jax.tree.map(lambda x: x + 1.0, targets.init_target(online))
  new = jax.jit(targets.polyak_update)(target, online, 0.25)
  for n, t, o in zip(jax.tree.leaves(new), jax.tree.leaves(target), jax.tree.leaves(online)):
    np.testing.assert_allclose(n, 0.75 * t + 0.25 * o, rtol=1e-5, atol=1e-7)
  is_var = lambda x: isinstance(x, nnx.Variable)
  new_axes = [v.get_metadata().get("logical_axes") for v in jax.tree.leaves(new, is_leaf=is_var)]
  online_axes = [v.get_metadata().get("logical_axes") for v in jax.tree.leaves(online, is_leaf=is_var)]
  assert new_axes == online_axes and all(a is not None for a in new_axes)


def test_init_target_is_an_independent_copy():
  online = {"w": jnp.arange(3.0)}
  target = targets.init_target(online)
  np.testing.assert_array_equal(target["w"], online["w"])
  assert target["w"] is not online["w"]


def test_soft_update_moves_module_parameters_in_place():
  online = critic_lib.MLPHead(2, (3,), 1, rngs=nnx.Rngs(0))
  target = critic_lib.MLPHead(2, (3,), 1, rngs=nnx.Rngs(1))
  before = [np.asarray(x) for x in jax.tree.leaves(nnx.state(target, nnx.Param))]
  targets.soft_update(target, online, 0.1)
  after = jax.tree.leaves(nnx.state(target, nnx.Param))
  for a, b, o in zip(after, before, jax.tree.leaves(nnx.state(online, nnx.Param))):
    np.testing.assert_allclose(a, 0.9 * b + 0.1 * np.asarray(o), rtol=1e-5, atol=1e-7)
