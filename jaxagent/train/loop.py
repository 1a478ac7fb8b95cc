"""The training loop every recipe shares: mesh → sharded state → resume → jitted steps → metrics/checkpoints.

    final_ckpt = train(config, workdir, model_fn=..., loss_fn=..., dataset=...)

`dataset` is a Grain `MapDataset` of host batches (dicts of numpy arrays; this process's share of the global
batch), indexed in training order; its iterator position is checkpointed with the model, so a resumed run sees
exactly the batches an uninterrupted one would. Recipes supply only the model, the loss and the data.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

import grain
import jax
import numpy as np
import tqdm
from flax import nnx

from jaxagent import sharding
from jaxagent.train import mfu as mfu_lib
from jaxagent.train.checkpoint import Checkpointer
from jaxagent.train.metrics import MetricWriter
from jaxagent.train.optim import make_optimizer
from jaxagent.train.preemption import Preemption
from jaxagent.train.profiler import ProfileWindow
from jaxagent.train.state import TrainState, abstract_train_state, create_train_state, create_train_state_from_model
from jaxagent.train.step import AfterUpdate, LossFn, build_train_step, put_batch


def _rules(config):
  rules = config.get("sharding_rules")
  return tuple(rules) if rules else None


def _check_finite(metrics, step: int, ckpt: Checkpointer) -> None:
  """Raises FloatingPointError if the step's loss is NaN or infinite, before that state is checkpointed."""
  loss = float(jax.device_get(metrics["loss"]))
  if not np.isfinite(loss):
    raise FloatingPointError(
        f"train: the loss is {loss} at step {step}; the state was not checkpointed (the latest is step "
        f"{ckpt.latest_step()} in {ckpt.directory}). Lower optim.lr, tighten optim.clip_norm or check the "
        "loss's per-sample weights.")


def on_host(model: nnx.Module) -> nnx.Module:
  """The model with host (numpy) parameters, as `train`'s `pretrained` returns it: a loaded model sits on one
  device, and the training mesh may span several, where committed single-device arrays cannot enter its jit."""
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, jax.device_get(state))


def train(config, workdir: str, *, model_fn: Callable[[], nnx.Module], loss_fn: LossFn,
          dataset: grain.MapDataset, flops_per_token: float | None = None,
          on_start: Callable[[MetricWriter, TrainState], None] | None = None,
          read_options: grain.ReadOptions | None = None,
          pretrained: Callable[[], nnx.Module] | None = None, wrt=nnx.Param,
          after_update: AfterUpdate | None = None) -> str:
  """Trains for `config.train.steps` optimizer steps (resuming from `workdir`'s latest checkpoint).

  `model_fn()` builds the model from its seed (deterministic; run inside `jax.jit` with sharded outputs).
  `pretrained()`, if given, returns the starting model of a fresh run (e.g. loaded from a Hugging Face
  checkpoint); a resumed run skips it, as the checkpoint holds the weights.
  `flops_per_token`: analytic training FLOPs per input token (`mfu.transformer_flops_per_token`), for MFU.
  `wrt`: the variables the optimizer trains (an NNX filter); `after_update(model, step)` runs inside the step
  after each update (a target network's Polyak average, say); both are checkpointed with the rest.
  Returns the path of the final checkpoint.
  """
  tcfg = config.train
  total = int(tcfg.steps)
  mesh = sharding.make_mesh(dict(config.mesh))
  rules = _rules(config)
  tx, schedule = make_optimizer(config.optim, total)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  resuming = os.path.isdir(ckpt_dir) and any(p.isdigit() for p in os.listdir(ckpt_dir))
  if resuming:  # the checkpoint replaces every array: restore into the bare structure
    ts = abstract_train_state(model_fn, tx, mesh, rules, wrt)
  elif pretrained is not None:
    ts = create_train_state_from_model(pretrained(), tx, mesh, rules, wrt)
  else:
    ts = create_train_state(model_fn, tx, mesh, rules, wrt)
  rng = jax.random.key(int(config.seed))

  ckpt = Checkpointer(ckpt_dir, every=config.checkpoint.every,
                      keep=config.checkpoint.keep, async_save=config.checkpoint.async_save)
  data_iter = iter(dataset.to_iter_dataset(read_options))
  restored = ckpt.restore(ts.abstract_state(), rng)
  if restored is None and resuming:
    raise RuntimeError(f"{ckpt_dir} lists step directories but none restored; move it aside to start afresh")
  if restored is not None:
    ts.state, rng, data_state, _ = restored
    data_iter.set_state(data_state)
    logging.info("resumed from %s at step %d", ckpt.directory, ts.step)
  start = ts.step

  step_fn, b_shard = build_train_step(ts, loss_fn, schedule, mesh, dataset[0], int(tcfg.grad_accum_steps),
                                      rules, wrt, after_update)
  writer = MetricWriter(workdir)
  if on_start is not None and start == 0:
    on_start(writer, ts)
  profile = ProfileWindow(workdir, config.profile.start_step, config.profile.num_steps)
  peak, peak_source = mfu_lib.peak_flops(config.get("peak_flops", 0.0))
  writer.write_texts(start, {"peak_flops_source": f"{peak_source}: {peak:.3e} FLOP/s"})

  bar = tqdm.tqdm(total=total, initial=start, disable=not tcfg.progress_bar, desc=config.recipe or "train")
  window_t0, window_steps, window_tokens = None, 0, 0
  metrics = None
  preempt = Preemption()
  with preempt:
    for step in range(start, total):
      batch = next(data_iter)
      profile.before_step(step)
      with jax.set_mesh(mesh), jax.profiler.StepTraceAnnotation("train", step_num=step):
        ts.state, metrics = step_fn(ts.state, put_batch(batch, b_shard), jax.random.fold_in(rng, step))
      profile.after_step(step, metrics)
      stop = preempt.requested  # SIGTERM came: save this step, then stop
      force = step + 1 == total or stop
      if (step + 1) % ckpt.every == 0 or force:
        _check_finite(metrics, step + 1, ckpt)  # never checkpoint a diverged state: a resume would restore it
      ckpt.save(step + 1, ts.state, rng, data_iter.get_state(), force=force)

      if window_t0 is None:  # the first step compiles: time from its end
        jax.block_until_ready(metrics)
        window_t0 = time.perf_counter()
      else:
        window_steps += 1
        window_tokens += int(np.prod(batch["input_ids"].shape)) * jax.process_count() if "input_ids" in batch else 0
      bar.update(1)
      if (step + 1) % int(tcfg.log_every) == 0 or step + 1 == total or step == start:
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if window_steps:
          dt = time.perf_counter() - window_t0
          values["steps_per_s"] = window_steps / dt
          values["tokens_per_s"] = window_tokens / dt
          if flops_per_token:
            values["mfu"] = mfu_lib.mfu(flops_per_token * window_tokens / window_steps, dt / window_steps, peak)
          window_t0, window_steps, window_tokens = time.perf_counter(), 0, 0
        writer.write_scalars(step + 1, values)
        bar.set_postfix(loss=f"{values['loss']:.4f}")
      if stop:
        logging.warning("SIGTERM at step %d: saved %s, stopping", step + 1, ckpt.path(step + 1))
        break
  bar.close()
  profile.close()
  if start >= total and ckpt.latest_step() is None:
    ckpt.save(total, ts.state, rng, data_iter.get_state(), force=True)
  ckpt.close()
  writer.close()
  preempt.resend()  # the checkpoint is written: die of the SIGTERM as the run would have
  return ckpt.path(ckpt.latest_step())


def restore_model(config, workdir: str, model_fn: Callable[[], nnx.Module], wrt=nnx.Param) -> nnx.Module:
  """The model of `workdir`'s latest checkpoint, as `train` saved it with this `config`, `model_fn` and `wrt`
  (the small models trained on precomputed features: critics), on one device."""
  tx, _ = make_optimizer(config.optim, int(config.train.steps))
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.local_devices()[:1])
  ts = abstract_train_state(model_fn, tx, mesh, wrt=wrt)
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
  try:
    restored = ckpt.restore(ts.abstract_state(), jax.random.key(0))
  finally:
    ckpt.close()
  if restored is None:
    raise FileNotFoundError(f"{workdir}/checkpoints holds no checkpoint to restore")
  ts.state = restored[0]
  return ts.model()
