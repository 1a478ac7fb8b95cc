"""Compiled memory of a SmolLM2-135M LoRA train step against the sequence length, per attention kernel and remat.

Compile only (`train.memory.step_memory`): no weights are loaded and no step runs, so every figure is XLA's own
`memory_analysis()` of the step the config would run. `--layers N` cuts the model to its first N layers (the
shape of `tests/conftest.py::smollm2_cut`), for a quick look. `--steps N` also times N steps (after one warm-up) of
the same step from random weights.

  python benchmarks/long_context.py [--seqs 1024,2048,4096,8192] [--batch 2] [--attention xla,flash]
                                    [--remat none,full] [--layers 0] [--rank 8] [--dtype float32] [--steps 0]
                                    [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for configs/

# pylint: disable=g-import-not-at-top,wrong-import-position
from configs import il as il_config  # noqa: E402
from jaxagent import models, sharding  # noqa: E402
from jaxagent.data.tokenizer import load_tokenizer  # noqa: E402
from jaxagent.models.hf import gguf  # noqa: E402
from jaxagent.train.losses import weighted_token_nll  # noqa: E402
from jaxagent.train.memory import step_memory, text_batch  # noqa: E402
from jaxagent.train.optim import make_optimizer  # noqa: E402
from jaxagent.train.state import create_train_state  # noqa: E402
from jaxagent.train.step import build_train_step, put_batch  # noqa: E402


def cut_checkpoint(layers: int, out: str) -> str:
  """SmolLM2's config and tokenizer in `out` with `layers` layers and no weights: enough to compile a step."""
  src = gguf.smollm2_hf_dir()
  for name in os.listdir(src):
    if name not in ("model.safetensors", "config.json"):
      shutil.copy(os.path.join(src, name), os.path.join(out, name))
  with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
    json.dump(dict(config, num_hidden_layers=layers), f)
  return out


def config_for(checkpoint: str, seq: int, attention: str, remat: str, rank: int, dtype: str = "float32"):
  config = il_config.get_config("text")
  config.model.update(hf_checkpoint=checkpoint, attention=attention, remat=remat, dtype=dtype)
  config.model.lora.rank = rank
  config.data.seq_len = seq
  return config


def step_seconds(config, tokenizer, batch: int, seq: int, steps: int) -> list[float]:
  """Wall time of `steps` train steps (after one that compiles) from random weights on random tokens."""
  built = models.build(config, tokenizer)
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  tx, schedule = make_optimizer(config.optim, 100)
  ts = create_train_state(built.init, tx, mesh, wrt=built.trainable)
  host = text_batch(batch, seq)
  ids = np.random.RandomState(0).randint(0, len(tokenizer), (batch, seq + 1)).astype(np.int32)
  host.update(input_ids=ids[:, :-1], targets=ids[:, 1:], loss_mask=np.ones_like(ids[:, 1:]))
  step, shardings = build_train_step(ts, weighted_token_nll, schedule, mesh, host, wrt=built.trainable)
  state, device_batch, times = ts.state, put_batch(host, shardings), []
  for i in range(steps + 1):
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
      state, metrics = step(state, device_batch, jax.random.key(0))
    float(metrics["loss"])  # waits for the step
    if i:
      times.append(time.perf_counter() - t0)
  return times


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seqs", default="1024,2048,4096,8192")
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--attention", default="xla,flash")
  parser.add_argument("--remat", default="none,full")
  parser.add_argument("--layers", type=int, default=0, help="cut SmolLM2 to this many layers (0: all 30)")
  parser.add_argument("--rank", type=int, default=8, help="LoRA rank (0: full fine-tuning)")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                      help="the compute dtype (parameters stay float32)")
  parser.add_argument("--steps", type=int, default=0, help="also time this many steps (0: compile only)")
  parser.add_argument("--json", default="")
  args = parser.parse_args()

  with tempfile.TemporaryDirectory() as tmp:
    checkpoint = cut_checkpoint(args.layers, tmp) if args.layers else "smollm2"
    tokenizer = load_tokenizer(gguf.checkpoint_dir(checkpoint), require_image_token=False)
    rows = []
    for attention in args.attention.split(","):
      for remat in args.remat.split(","):
        for seq in map(int, args.seqs.split(",")):
          config = config_for(checkpoint, seq, attention, remat, args.rank, args.dtype)
          row = dict(attention=attention, remat=remat, seq=seq, **step_memory(config, tokenizer, args.batch, seq))
          timed = ""
          if args.steps:
            row["step_s"] = step_seconds(config, tokenizer, args.batch, seq, args.steps)
            timed = f", step {np.median(row['step_s']):.2f} s (median of {args.steps})"
          rows.append(row)
          print(f"{attention:>6} remat={remat:<5} seq {seq:>5} x {args.batch}: temp {row['temp'] / 2**20:8.0f} MiB, "
                f"peak (args + temp + out - alias) {row['peak'] / 2**30:6.2f} GiB{timed}", flush=True)
  out = {"machine": {"platform": platform.platform(), "jax": jax.__version__, "device": str(jax.devices()[0]),
                     "load_avg_at_end": os.getloadavg()},
         "batch": args.batch, "layers": args.layers or 30, "lora_rank": args.rank, "dtype": args.dtype, "rows": rows}
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(out, f, indent=2)


if __name__ == "__main__":
  main()
