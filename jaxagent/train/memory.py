"""What a config's train step needs in memory, from XLA's compiled program alone: no weights loaded, no step run.

    mem = step_memory(config, tokenizer, batch_size=2, seq_len=4096)   # bytes: arguments, temp, output, ...

The state is abstract (`train.state.abstract_train_state`: shapes and shardings only) and the batch a dict of
ShapeDtypeStructs, so a 4k-token SmolLM2 step is sized in a compile's time and memory, on any machine
(`compiled.memory_analysis()`, as maxtext prints before step 1).
"""

from __future__ import annotations

import jax
import numpy as np

from jaxagent import models, sharding
from jaxagent.train.losses import weighted_token_nll
from jaxagent.train.optim import make_optimizer
from jaxagent.train.state import abstract_train_state
from jaxagent.train.step import LossFn, build_train_step


def text_batch(batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
  """A decoder's padded SFT batch of that shape (zeros: only the shapes reach the compiler)."""
  ids = np.zeros((batch_size, seq_len), np.int32)
  return {"input_ids": ids, "targets": ids, "loss_mask": ids, "attention_mask": np.ones_like(ids, bool)}


def step_memory(config, tokenizer, batch_size: int, seq_len: int, loss_fn: LossFn = weighted_token_nll,
                batch: dict | None = None) -> dict[str, int]:
  """Bytes of the compiled train step of `config.model` (its LoRA, remat and attention settings) on one device:
  `argument` (model + optimizer state + batch), `temp` (XLA's temporaries: activations, residuals, gradients),
  `output`, `alias` (outputs written over donated arguments), and `peak` = argument + temp + output - alias."""
  built = models.build(config, tokenizer)
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  tx, schedule = make_optimizer(config.optim, 100)
  ts = abstract_train_state(built.init, tx, mesh, wrt=built.trainable)
  host = text_batch(batch_size, seq_len) if batch is None else batch
  step, shardings = build_train_step(ts, loss_fn, schedule, mesh, host, wrt=built.trainable)
  abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in host.items()}
  with jax.set_mesh(mesh):
    mem = step.lower(ts.abstract_state(), abstract, jax.random.key(0)).compile().memory_analysis()
  out = {"argument": int(mem.argument_size_in_bytes), "temp": int(mem.temp_size_in_bytes),
         "output": int(mem.output_size_in_bytes), "alias": int(mem.alias_size_in_bytes)}
  out["peak"] = out["argument"] + out["temp"] + out["output"] - out["alias"]
  return out
