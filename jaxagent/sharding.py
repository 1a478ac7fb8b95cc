"""The device mesh and the one place where logical axis names become partition specs.

Model code names every parameter axis (`nnx.Param(value, logical_axes=("embed", "mlp"))`) and constrains
activations with `shard(x, ("batch", "length", "act_embed"))`. Only this module knows how those names map
onto the mesh axes `("data", "fsdp", "tensor")`, through one rules table (`RULES`, overridable from the
config). A mesh axis that does not divide a dimension is dropped for that dimension (the array is
replicated along it), so tiny test models run on any mesh.

We keep our own `logical_axes` metadata key rather than Flax's `out_sharding` so that Flax's eager
sharding never sees names that are not mesh axes; shardings are applied by `jax.jit(out_shardings=...)`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axis, tuple of mesh axes, or None (replicated).
RULES: tuple[tuple[str, Any], ...] = (
    # activations
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    # parameters
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
    ("norm", None),
    ("vision_embed", "fsdp"),
    ("vision_mlp", "tensor"),
    ("vision_heads", "tensor"),
    ("patch", None),
    ("value_out", None),
)


def make_mesh(shape: Mapping[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh over (data, fsdp, tensor); one size may be -1 to take the remaining devices.

  Axes are `Auto` so that `shard()` constraints and jit shardings compose (jax>=0.9 `make_mesh` defaults
  to Explicit axes, which this code does not use).
  """
  devices = list(devices if devices is not None else jax.devices())
  shape = dict(shape or {"data": 1, "fsdp": -1, "tensor": 1})
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"mesh: unknown axis {sorted(unknown)}; the mesh axes are {MESH_AXES}")
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh: at most one axis may be -1, got {shape}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"mesh: {len(devices)} devices do not divide by the fixed axes {shape}")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(
        f"mesh: {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices but {len(devices)} are "
        "visible; fix config.mesh or set one axis to -1")
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def _rules_dict(rules) -> dict[str, Any]:
  return dict(rules if rules is not None else RULES)


def logical_to_spec(names: Sequence[str | None] | None, shape: Sequence[int] | None = None,
                    mesh: Mesh | None = None, rules=None) -> P:
  """PartitionSpec for an array whose axes carry these logical names.

  With `shape` and `mesh`, mesh axes that do not divide the dimension (or are already used by an
  earlier dimension) are dropped.
  """
  if names is None:
    return P()
  table = _rules_dict(rules)
  used: set[str] = set()
  spec = []
  for i, name in enumerate(names):
    if name is None:
      spec.append(None)
      continue
    if name not in table:
      raise KeyError(f"logical axis {name!r} has no sharding rule; add it to sharding.RULES or config.sharding_rules")
    target = table[name]
    axes = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
    kept = []
    for axis in axes:
      if axis in used:
        continue
      if mesh is not None:
        size = mesh.shape[axis]
        if shape is not None and shape[i] % (size * math.prod(mesh.shape[a] for a in kept)):
          continue
        if size == 1:
          continue
      kept.append(axis)
    used.update(kept)
    spec.append(None if not kept else (kept[0] if len(kept) == 1 else tuple(kept)))
  while spec and spec[-1] is None:
    spec.pop()
  return P(*spec)


def _current_mesh() -> Mesh | None:
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return None
  return mesh


def shard(x: jax.Array, names: Sequence[str | None], rules=None) -> jax.Array:
  """Constrain an activation's sharding by logical names; a no-op outside a mesh (`jax.set_mesh`)."""
  mesh = _current_mesh()
  if mesh is None:
    return x
  spec = logical_to_spec(names, x.shape, mesh, rules)
  return jax.lax.with_sharding_constraint(x, spec)


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def state_specs(state: Any, mesh: Mesh, rules=None) -> Any:
  """A tree of PartitionSpecs matching an nnx State (or any tree of Variables / arrays)."""

  def spec(leaf):
    if isinstance(leaf, nnx.Variable):
      names = leaf.get_metadata().get("logical_axes")
      return logical_to_spec(names, np.shape(leaf.get_value()), mesh, rules)
    return P()

  return jax.tree.map(spec, state, is_leaf=_is_variable)


def state_shardings(state: Any, mesh: Mesh, rules=None) -> Any:
  """NamedShardings for every leaf of `state`, following each Variable's `logical_axes`."""
  specs = state_specs(state, mesh, rules)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=None) -> NamedSharding:
  """Sharding of a host batch: leading axis over the data-parallel axes, the rest replicated."""
  spec = logical_to_spec(("batch",) + (None,) * (ndim - 1), None, None, rules)
  return NamedSharding(mesh, spec)


def local_mesh(shape: Mapping[str, int] | None = None) -> Mesh:
  """A mesh over this process's own devices, for inference (rollouts, scoring, serving): each process acts on
  its own episodes, so its policy must not need the other processes in every forward pass. `shape` as in
  `make_mesh`; with no -1 axis, the first prod(shape) local devices ({} = one device)."""
  shape = dict(shape or {})
  devices = jax.local_devices()
  if -1 not in shape.values():
    need = math.prod(int(shape.get(a, 1)) for a in MESH_AXES)
    if need > len(devices):
      raise ValueError(f"inference mesh {shape} needs {need} devices but this process has {len(devices)}; "
                       "fix the sampling mesh (e.g. --config.sampling.mesh.fsdp=-1 for all local devices)")
    devices = devices[:need]
  return make_mesh({a: int(shape.get(a, 1)) for a in MESH_AXES}, devices=devices)


def place(module: nnx.Module, mesh: Mesh, rules=None) -> nnx.Module:
  """`module` with every parameter laid out over `mesh` by its `logical_axes` (FSDP / tensor parallel): a model
  larger than one device runs in jit-compiled inference, XLA inserting the collectives."""
  graphdef, state = nnx.split(module)
  state = jax.device_put(state, state_shardings(state, mesh, rules))
  return nnx.merge(graphdef, state)
