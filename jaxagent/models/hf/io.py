"""Read and write Hugging Face safetensors directories, straight into (and out of) sharded jax.Arrays.

Every model family supplies one mapping table `{our param path: (hf key, Transform)}`; this module does the
rest for all of them:

- `load_state(abstract_model, table, path, mesh)` builds each parameter with `jax.make_array_from_callback`,
  whose callback reads only the slice a device needs (`safe_open(...).get_slice(key)[...]`), so the full
  model never sits on the host twice, whatever the mesh.
- `save_state(model, table, path)` writes `model.safetensors` (or shards + `model.safetensors.index.json`
  above `max_shard_bytes`) with `{"format": "pt"}` metadata, which `transformers` requires.

A `Transform` says how a HF tensor becomes ours: each HF axis splits into one or more of our axes (e.g.
`q_proj.weight [H*D, E]` → `[H, D, E]`), then a permutation (→ `[E, H, D]`). Both directions and the slice
arithmetic follow from that one description.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable, Mapping

import jax
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxagent import sharding

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointMismatchError(ValueError):
  """A tensor is missing, unexpected or of the wrong shape; the message names it and the expected shape."""


@dataclasses.dataclass(frozen=True)
class Transform:
  """HF tensor → ours: split each HF axis into `groups[i]` axes, then transpose by `perm`.

  `groups=None` means no split (one of our axes per HF axis); `perm=None` means no transpose.
  """
  groups: tuple[tuple[int, ...], ...] | None = None
  perm: tuple[int, ...] | None = None

  def _groups(self, hf_shape) -> tuple[tuple[int, ...], ...]:
    return self.groups if self.groups is not None else tuple((d,) for d in hf_shape)

  def to_hf_shape(self, ours_shape) -> tuple[int, ...]:
    """The HF shape that gives `ours_shape` (the inverse of `ours_shape`)."""
    perm = self.perm or tuple(range(len(ours_shape)))
    flat = [0] * len(ours_shape)
    for j, p in enumerate(perm):
      flat[p] = ours_shape[j]
    if self.groups is None:
      return tuple(flat)
    out, f = [], 0
    for g in self.groups:
      out.append(math.prod(flat[f:f + len(g)]))
      f += len(g)
    return tuple(out)

  def to_hf(self, ours: np.ndarray) -> np.ndarray:
    hf_shape = self.to_hf_shape(ours.shape)
    if self.perm is not None:
      ours = np.transpose(ours, np.argsort(self.perm))
    return ours.reshape(hf_shape)

  def read(self, get_slice: Callable[[tuple[slice, ...]], np.ndarray], hf_shape,
           index: tuple[slice, ...]) -> np.ndarray:
    """Our array's `index` block, reading only the HF rows it covers (whole split groups when needed)."""
    groups = self._groups(hf_shape)
    flat = [d for g in groups for d in g]
    perm = self.perm or tuple(range(len(flat)))
    flat_slices: list[slice] = [slice(None)] * len(flat)
    for ours_axis, s in enumerate(index):
      flat_slices[perm[ours_axis]] = s
    hf_slices, block_shape, post = [], [], []
    f = 0
    for g in groups:
      sub = [flat_slices[f + i].indices(g[i]) for i in range(len(g))]
      inner = math.prod(g[1:])
      if all(st == 0 and sp == d and step == 1 for (st, sp, step), d in zip(sub[1:], g[1:])) and sub[0][2] == 1:
        start, stop = sub[0][0], sub[0][1]
        hf_slices.append(slice(start * inner, stop * inner))
        block_shape += [stop - start] + list(g[1:])
        post += [slice(None)] * len(g)
      else:  # an inner sub-axis is cut: read the whole HF axis and cut after the reshape
        hf_slices.append(slice(None))
        block_shape += list(g)
        post += [slice(*s) for s in sub]
      f += len(g)
    block = np.asarray(get_slice(tuple(hf_slices))).reshape(block_shape)[tuple(post)]
    return np.transpose(block, perm) if self.perm is not None else block


IDENTITY = Transform()
TRANSPOSE = Transform(perm=(1, 0))

Table = Mapping[str, tuple[str, Transform]]


class SafetensorsDir:
  """A local checkpoint directory: one `model.safetensors`, an index with shards, or loose `*.safetensors`."""

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    if not os.path.isdir(self.path):
      raise FileNotFoundError(f"checkpoint directory {self.path!r} does not exist")
    index = os.path.join(self.path, INDEX_FILE)
    if os.path.exists(index):
      with open(index) as f:
        self.key_to_file = dict(json.load(f)["weight_map"])
    else:
      files = sorted(n for n in os.listdir(self.path) if n.endswith(".safetensors"))
      if not files:
        raise FileNotFoundError(f"{self.path!r} holds no *.safetensors file and no {INDEX_FILE}")
      self.key_to_file = {}
      for name in files:
        with safe_open(os.path.join(self.path, name), "numpy") as f:
          self.key_to_file.update({k: name for k in f.keys()})
    self._handles: dict[str, Any] = {}

  def _handle(self, key: str):
    name = self.key_to_file[key]
    if name not in self._handles:
      self._handles[name] = safe_open(os.path.join(self.path, name), "numpy")
    return self._handles[name]

  def keys(self) -> set[str]:
    return set(self.key_to_file)

  def shape(self, key: str) -> tuple[int, ...]:
    return tuple(self._handle(key).get_slice(key).get_shape())

  def read(self, key: str, slices: tuple[slice, ...] = ()) -> np.ndarray:
    view = self._handle(key).get_slice(key)
    return view[slices] if slices else view[:]


def _path_str(path) -> str:
  return ".".join(str(p) for p in path)


def flat_params(module_or_state) -> dict[str, nnx.Variable]:
  """Our parameters by dotted path (`layers.0.self_attn.q_proj.kernel`)."""
  state = module_or_state if isinstance(module_or_state, nnx.State) else nnx.state(module_or_state, nnx.Param)
  return {_path_str(p): v for p, v in nnx.to_flat_state(state)}


def load_state(abstract_model: nnx.Module, table: Table, path: str | os.PathLike, *, mesh=None,
               rules=None, dtype=None, ignore: Callable[[str], bool] = lambda key: False) -> nnx.Module:
  """Materialise `abstract_model` (from `nnx.eval_shape`) from the checkpoint at `path`.

  Each parameter is created with its target sharding (from `logical_axes` and the rules) by reading only
  the needed slices. `dtype` overrides the parameter dtype (default: the abstract model's).
  """
  ckpt = SafetensorsDir(path)
  graphdef, param_state, rest = nnx.split(abstract_model, nnx.Param, ...)
  flat = nnx.to_flat_state(param_state)
  params = {_path_str(p): v for p, v in flat}
  missing_rows = sorted(set(params) - set(table))
  if missing_rows:
    raise KeyError(f"mapping table has no entry for our parameters {missing_rows}")
  problems, present = [], ckpt.keys()
  for ours, (key, tr) in table.items():
    expected = params[ours].get_value().shape
    if key not in present:
      problems.append(f"missing tensor {key!r} (expected shape {tr.to_hf_shape(expected)}) for {ours}")
      continue
    got = ckpt.shape(key)
    if got != tr.to_hf_shape(expected):
      problems.append(f"tensor {key!r} has shape {got}, expected {tr.to_hf_shape(expected)} (for {ours} "
                      f"{tuple(expected)})")
  wanted = {key for key, _ in table.values()}
  unexpected = sorted(k for k in present - wanted if not ignore(k))
  problems += [f"unexpected tensor {k!r} with shape {ckpt.shape(k)}" for k in unexpected]
  if problems:
    raise CheckpointMismatchError(f"checkpoint {os.fspath(path)!r} does not match the model:\n  " +
                                  "\n  ".join(problems))

  if mesh is not None:
    shardings = {_path_str(p): s for p, s in nnx.to_flat_state(
        sharding.state_shardings(param_state, mesh, rules))}
  single = jax.sharding.SingleDeviceSharding(jax.devices()[0])

  def make(ours: str, var: nnx.Variable) -> jax.Array:
    key, tr = table[ours]
    shape = tuple(var.get_value().shape)
    target = np.dtype(dtype or var.get_value().dtype)
    hf_shape = ckpt.shape(key)
    read = lambda slices: ckpt.read(key, slices)
    return jax.make_array_from_callback(
        shape, shardings[ours] if mesh is not None else single,
        lambda index: tr.read(read, hf_shape, _full_index(index, shape)).astype(target))

  for ours, var in params.items():
    var.set_value(make(ours, var))
  return nnx.merge(graphdef, nnx.from_flat_state(flat), rest)


def _full_index(index, shape) -> tuple[slice, ...]:
  index = tuple(index) + (slice(None),) * (len(shape) - len(index))
  return tuple(slice(*s.indices(d)) for s, d in zip(index, shape))


def export_tensors(model: nnx.Module, table: Table, dtype=None) -> dict[str, np.ndarray]:
  """Our parameters as HF-named host arrays (gathered one tensor at a time)."""
  params = flat_params(model)
  out = {}
  for ours, (key, tr) in table.items():
    value = np.asarray(jax.device_get(params[ours].get_value()))
    if dtype is not None:
      value = value.astype(dtype)
    out[key] = np.ascontiguousarray(tr.to_hf(value))
  return out


def write_safetensors(tensors: Mapping[str, np.ndarray], path: str | os.PathLike,
                      max_shard_bytes: int = 5 * 2**30) -> list[str]:
  """Write `tensors` as HF does: one file, or `model-0000i-of-0000n.safetensors` shards plus an index."""
  path = os.fspath(path)
  os.makedirs(path, exist_ok=True)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for key in sorted(tensors):
    nbytes = tensors[key].nbytes
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][key] = tensors[key]
    size += nbytes
  metadata = {"format": "pt"}
  if len(shards) == 1:
    save_file(dict(shards[0]), os.path.join(path, SINGLE_FILE), metadata=metadata)
    return [SINGLE_FILE]
  names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  weight_map = {}
  for name, shard in zip(names, shards):
    save_file(dict(shard), os.path.join(path, name), metadata=metadata)
    weight_map.update({k: name for k in shard})
  index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))}, "weight_map": weight_map}
  with open(os.path.join(path, INDEX_FILE), "w") as f:
    json.dump(index, f, indent=2, sort_keys=True)
  return names


def save_state(model: nnx.Module, table: Table, path, *, dtype=None, max_shard_bytes: int = 5 * 2**30):
  return write_safetensors(export_tensors(model, table, dtype), path, max_shard_bytes)
