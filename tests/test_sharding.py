import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxagent import sharding


def test_rules_map_logical_names_and_drop_non_dividing_axes():
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  assert sharding.logical_to_spec(("embed", "mlp"), (8, 8), mesh) == P("fsdp", "tensor")
  # 3 is not divisible by tensor=2: replicated along that dimension.
  assert sharding.logical_to_spec(("embed", "heads"), (8, 3), mesh) == P("fsdp")
  assert sharding.logical_to_spec(("batch", "length"), (8, 5), mesh) == P(("data", "fsdp"))


def test_unknown_logical_name_is_an_error():
  with pytest.raises(KeyError, match="no sharding rule"):
    sharding.logical_to_spec(("nonsense",))


def test_mesh_size_mismatch_names_the_fix():
  with pytest.raises(ValueError, match="config.mesh"):
    sharding.make_mesh({"data": 3, "fsdp": 1, "tensor": 1})


def test_state_shardings_follow_metadata():
  class M(nnx.Module):
    def __init__(self):
      self.w = nnx.Param(jnp.ones((4, 6)), logical_axes=("embed", "mlp"))

  mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
  specs = sharding.state_specs(nnx.state(M()), mesh)
  assert specs["w"] == P("fsdp", "tensor")


def test_shard_is_noop_without_mesh_and_constrains_inside():
  x = jnp.ones((8, 4))
  assert sharding.shard(x, ("batch", "act_embed")) is x
  mesh = sharding.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
  with jax.set_mesh(mesh):
    y = jax.jit(lambda v: sharding.shard(v * 2, ("batch", "act_embed")))(x)
  assert y.sharding.spec == P(("data", "fsdp"))
