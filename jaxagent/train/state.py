"""Train state: the model and its optimizer as one sharded `nnx.State`, created directly on the mesh.

We use NNX's functional form (`graphdef, state = nnx.split((model, optimizer))`): the jitted step takes and
returns `state`, so its shardings can be given explicitly and its buffers donated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import optax
from flax import nnx
from jax.sharding import Mesh

from jaxagent import sharding


@dataclasses.dataclass
class TrainState:
  graphdef: Any  # static structure of (model, optimizer)
  state: Any  # nnx.State of (model, optimizer): sharded jax.Arrays
  shardings: Any  # NamedShardings, same tree as `state`

  @property
  def step(self) -> int:
    return int(self.state[1]["step"].get_value())

  def model(self) -> nnx.Module:
    """A model view of the current parameters (for evaluation, sampling or export)."""
    return nnx.merge(self.graphdef, self.state)[0]

  def abstract_state(self):
    """ShapeDtypeStructs carrying shardings, the target for a sharded checkpoint restore."""
    def one(s, var):
      value = var.get_value()
      return var.replace(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=s))

    return jax.tree.map(one, self.shardings, self.state)


def _model_and_optimizer(model_fn: Callable[[], nnx.Module], tx: optax.GradientTransformation, wrt=nnx.Param):
  model = model_fn()
  return model, nnx.Optimizer(model, tx, wrt=wrt)


def abstract_train_state(model_fn: Callable[[], nnx.Module], tx: optax.GradientTransformation, mesh: Mesh,
                         rules=None, wrt=nnx.Param) -> TrainState:
  """The train state's structure, shapes and shardings with no arrays (`state` holds ShapeDtypeStructs): the
  target of a checkpoint restore, which would overwrite initialised weights anyway. Nothing is compiled (the
  tiny VLM's jitted init alone takes ~5 s to compile on a CPU)."""
  graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: _model_and_optimizer(model_fn, tx, wrt)))
  return TrainState(graphdef, abstract_state, sharding.state_shardings(abstract_state, mesh, rules))


def create_train_state(model_fn: Callable[[], nnx.Module], tx: optax.GradientTransformation, mesh: Mesh,
                       rules=None, wrt=nnx.Param) -> TrainState:
  """Builds (model, optimizer) inside `jax.jit` with sharded outputs: no unsharded copy on any host.

  `model_fn()` must be deterministic (it seeds its own `nnx.Rngs`), so every process builds the same model.
  `wrt`: the variables the optimizer trains (an NNX filter; default every `nnx.Param`).
  """
  abstract = abstract_train_state(model_fn, tx, mesh, rules, wrt)
  graphdef, shardings = abstract.graphdef, abstract.shardings

  def init():
    return nnx.split(_model_and_optimizer(model_fn, tx, wrt))[1]

  with jax.set_mesh(mesh):
    state = jax.jit(init, out_shardings=shardings)()
  return TrainState(graphdef, state, shardings)


def create_train_state_from_model(model: nnx.Module, tx: optax.GradientTransformation, mesh: Mesh,
                                  rules=None, wrt=nnx.Param) -> TrainState:
  """A train state around an existing model (e.g. loaded from a Hugging Face checkpoint, already sharded).

  The optimizer state is initialised inside `jax.jit` with sharded outputs, and the model's arrays are
  resharded to the rules' layout if they were placed differently.
  """
  model_def, model_state = nnx.split(model)

  def build():
    return _model_and_optimizer(lambda: nnx.merge(model_def, model_state), tx, wrt)

  graphdef, abstract_state = nnx.split(nnx.eval_shape(build))
  shardings = sharding.state_shardings(abstract_state, mesh, rules)

  def init(params):
    return nnx.split(_model_and_optimizer(lambda: nnx.merge(model_def, params), tx, wrt))[1]

  with jax.set_mesh(mesh):
    state = jax.jit(init, out_shardings=shardings)(model_state)
  return TrainState(graphdef, state, shardings)
