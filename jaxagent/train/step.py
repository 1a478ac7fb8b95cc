"""The jitted train step, generic over the loss: `loss_fn(model, batch, rng) -> (loss, aux_metrics)`.

Every training in every recipe (supervised fine-tuning through `pipeline.finetune`, Digi-Q's critic, ...) builds
its step here; only the loss, the trainable variables (`wrt`) and an optional in-step update of the others
(`after_update`, e.g. a Polyak-averaged target network) differ. Gradients accumulate over `grad_accum_steps` micro-batches with a `lax.scan` inside one jit, so one call
is one optimizer update whatever the accumulation.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxagent import sharding
from jaxagent.train.state import TrainState

LossFn = Callable[[nnx.Module, dict, jax.Array], tuple[jax.Array, dict]]
# (model, optimizer step after the update) -> None: updates non-trained variables in place, inside the jit
AfterUpdate = Callable[[nnx.Module, jax.Array], None]


def _global_shape(x) -> tuple[int, ...]:
  """The global batch's shape, from this process's share (processes split the leading axis evenly)."""
  return (x.shape[0] * jax.process_count(), *x.shape[1:])


def batch_shardings(batch: dict, mesh: Mesh, rules=None) -> dict:
  """Leading (batch) axis over the data-parallel mesh axes, where the global batch divides; the rest
  replicated. `batch` is a host batch (this process's share)."""

  def one(x):
    names = ("batch",) + (None,) * (x.ndim - 1)
    spec = sharding.logical_to_spec(names, _global_shape(x), mesh, rules)
    if jax.process_count() > 1 and (not spec or spec[0] is None):
      raise ValueError(
          f"train.batch_size={_global_shape(x)[0]} does not divide over the data-parallel mesh axes "
          f"{dict(mesh.shape)}, so the batch would be replicated, but each of the {jax.process_count()} "
          "processes loads a different part of it; make train.batch_size a multiple of mesh data×fsdp (> 1)")
    return NamedSharding(mesh, spec)

  return jax.tree.map(one, batch)


def put_batch(batch: dict, shardings: dict) -> dict:
  """Host numpy batch (this process's share) → global sharded jax.Arrays (multi-host safe; JAX rejects a
  sharding that does not split the batch across processes)."""
  return jax.tree.map(lambda s, x: jax.make_array_from_process_local_data(s, x, _global_shape(x)), shardings,
                      batch)


def _split_micro(x, n: int):
  if x.shape[0] % n:
    raise ValueError(f"train.grad_accum_steps={n} must divide the batch's leading dimension {x.shape[0]}")
  return x.reshape(n, x.shape[0] // n, *x.shape[1:])


def make_step_fn(graphdef, loss_fn: LossFn, schedule: optax.Schedule, grad_accum_steps: int = 1, wrt=nnx.Param,
                 after_update: AfterUpdate | None = None):
  """The un-jitted step `(state, batch, rng) -> (state, metrics)`; see `build_train_step`."""

  def step(state, batch, rng):
    model, optimizer = nnx.merge(graphdef, state)
    model_def, params, rest = nnx.split(model, wrt, ...)

    def loss_of(params, micro, rng):
      loss, aux = loss_fn(nnx.merge(model_def, params, rest), micro, rng)
      return loss, aux

    grad_fn = jax.value_and_grad(loss_of, has_aux=True)
    if grad_accum_steps == 1:
      (loss, aux), grads = grad_fn(params, batch, rng)
    else:
      micro = jax.tree.map(lambda x: _split_micro(x, grad_accum_steps), batch)

      def body(carry, xs):
        i, mb = xs
        (loss, aux), grads = grad_fn(params, mb, jax.random.fold_in(rng, i))
        return jax.tree.map(jnp.add, carry, (loss, aux, grads)), None

      (loss0, aux0), _ = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro), rng)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss0, aux0, params))
      summed, _ = jax.lax.scan(body, zeros, (jnp.arange(grad_accum_steps), micro))
      loss, aux, grads = jax.tree.map(lambda x: x / grad_accum_steps, summed)

    lr = schedule(optimizer.step.get_value())
    optimizer.update(model, grads)
    if after_update is not None:
      after_update(model, optimizer.step.get_value())
    metrics = {"loss": loss, "grad_norm": optax.global_norm(grads), "lr": lr, **aux}
    return nnx.state((model, optimizer)), metrics

  return step


def build_train_step(ts: TrainState, loss_fn: LossFn, schedule: optax.Schedule, mesh: Mesh,
                     example_batch: dict, grad_accum_steps: int = 1, rules=None, wrt=nnx.Param,
                     after_update: AfterUpdate | None = None):
  """`jax.jit` of the step with explicit in/out shardings and the state's buffers donated.

  Returns (step_fn, batch_shardings); call `step_fn(state, put_batch(host_batch, batch_shardings), rng)`.
  """
  b_shard = batch_shardings(example_batch, mesh, rules)
  replicated = NamedSharding(mesh, P())
  fn = jax.jit(make_step_fn(ts.graphdef, loss_fn, schedule, grad_accum_steps, wrt, after_update),
               in_shardings=(ts.shardings, b_shard, replicated),
               out_shardings=(ts.shardings, replicated),
               donate_argnums=(0,))
  return fn, b_shard
