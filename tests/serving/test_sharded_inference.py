"""Sharded inference: a policy laid out over several devices (FSDP x tensor) generates what it does on one.

The suite runs with 8 simulated CPU devices (tests/conftest.py), so the meshes here are real multi-device meshes.
"""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from jaxagent import serve, sharding
from jaxagent.serving.checkpoint import export_policy, load_policy, random_policy
from jaxagent.serving.engine import Engine, GenerationRequest

MESH = {"fsdp": 2, "tensor": 2}


def _devices_used(model) -> set:
  return {d for leaf in jax.tree.leaves(nnx.state(model)) for d in leaf.sharding.device_set}


def _sharded_leaves(model) -> int:
  return sum(1 for leaf in jax.tree.leaves(nnx.state(model)) if not leaf.sharding.is_fully_replicated)


def _requests(kind: str) -> list[GenerationRequest]:
  if kind == "decoder":
    return [GenerationRequest(prompt="the cart holds " * k, max_tokens=12, temperature=0.0) for k in (1, 3)]
  image = np.random.RandomState(0).randint(0, 255, (40, 30, 3), dtype=np.uint8)
  return [GenerationRequest(prompt="<image> open the cart", images=[image], max_tokens=12, temperature=0.0)]


@pytest.mark.parametrize("kind", ["decoder", "vlm"])
@pytest.mark.slow
def test_a_placed_policy_generates_what_one_device_does(kind):
  policy = random_policy(kind)
  mesh = sharding.local_mesh(MESH)
  placed = dataclasses.replace(policy, model=sharding.place(policy.model, mesh))
  assert len(_devices_used(placed.model)) == 4 and _sharded_leaves(placed.model) > 0
  one = [r.text for r in Engine(policy, max_batch=4, max_new_tokens=16).generate(_requests(kind))]
  four = [r.text for r in Engine(placed, max_batch=4, max_new_tokens=16).generate(_requests(kind))]
  assert four == one and all(one)


@pytest.mark.slow  # over 2 s alone
def test_load_policy_restores_onto_the_mesh(tmp_path):
  export = export_policy(random_policy("decoder", seed=3), str(tmp_path / "export"))
  one = load_policy(export)
  four = load_policy(export, mesh=sharding.local_mesh(MESH))
  assert len(_devices_used(one.model)) == 1
  assert len(_devices_used(four.model)) == 4 and _sharded_leaves(four.model) > 0
  reqs = _requests("decoder")
  assert ([r.text for r in Engine(four, max_new_tokens=16).generate(reqs)] ==
          [r.text for r in Engine(one, max_new_tokens=16).generate(reqs)])


@pytest.mark.slow
def test_the_server_runs_a_sharded_policy(tmp_path):
  export = export_policy(random_policy("decoder", seed=4), str(tmp_path / "export"))
  request = GenerationRequest(prompt="the cart holds", max_tokens=8, temperature=0.0)
  _, one = serve.build(export, max_batch=2, max_new_tokens=16)
  _, four = serve.build(export, max_batch=2, max_new_tokens=16, mesh=MESH)
  try:
    assert four.generate(request).text == one.generate(request).text
  finally:
    one.close()
    four.close()


def test_meshes_are_checked_with_the_fix_named():
  assert serve.parse_mesh("fsdp=4,tensor=2") == {"fsdp": 4, "tensor": 2}
  with pytest.raises(ValueError, match="'pipeline=2' is not AXIS=SIZE"):
    serve.parse_mesh("pipeline=2")
  with pytest.raises(ValueError, match="needs 16 devices but this process has 8"):
    sharding.local_mesh({"fsdp": 16})
  assert sharding.local_mesh({"fsdp": -1}).shape["fsdp"] == jax.local_device_count()
  assert sharding.local_mesh().devices.size == 1
