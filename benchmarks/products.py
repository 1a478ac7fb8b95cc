"""SmolLM2's projections, forward and backward, ours against PyTorch's in the same run: where a fine-tuning step's
products stand against the library PyTorch calls (oneDNN), shape by shape.

Each projection of SmolLM2-135M at batch × sequence rows is timed as a training step runs it: the product, then
its input's and its weight's gradients (`jax.vjp` of `layers.matmul`, our bfloat16 path on CPU included, jitted;
PyTorch: `x @ w` and `backward`), or the product and the input's gradient alone (`--frozen`: LoRA's frozen base).
Each side runs `--repeats` calls in a block after an untimed one, twice, in turn; medians; ours / PyTorch > 1 is
ours faster. The last line weighs each shape by how often a step runs it (30 layers: q and o, k and v, gate and up,
down; the tied logits once).

  python benchmarks/products.py [--seq 1024] [--batch 2] [--dtype bfloat16] [--frozen] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's jaxagent

# pylint: disable=g-import-not-at-top,wrong-import-position
from jaxagent import host_memory
from jaxagent.models import layers
from jaxagent.train import mfu

LAYERS = 30
# name, input features K, output features N, products of that shape a step runs
SHAPES = (("q, o", 576, 576, 2 * LAYERS), ("k, v", 576, 192, 2 * LAYERS), ("gate, up", 576, 1536, 2 * LAYERS),
          ("down", 1536, 576, LAYERS), ("logits (tied)", 576, 49152, 1))
TIED = "logits (tied)"  # the embedding [V, E] read transposed, float32 logits (`layers.logits_2d`)


def ours(rows: int, k: int, n: int, dtype: str, frozen: bool, tied: bool):
  """A timed call: the product and its gradients, jitted, on fixed random operands."""
  keys = jax.random.split(jax.random.key(0), 3)
  x = (jax.random.normal(keys[0], (rows, k)) * 0.1).astype(dtype)
  w = (jax.random.normal(keys[1], (n, k) if tied else (k, n)) * 0.05).astype(dtype)
  product = (lambda x, w: layers.logits_2d(x, w, kernel_transposed=True)) if tied else layers.matmul
  g = jax.random.normal(keys[2], (rows, n)).astype(jax.eval_shape(product, x, w).dtype)

  @jax.jit
  def step(x, w, g):
    if frozen:
      y, vjp = jax.vjp(lambda x: product(x, w), x)
    else:
      y, vjp = jax.vjp(product, x, w)
    return y, vjp(g)

  return lambda: jax.block_until_ready(step(x, w, g))


def theirs(rows: int, k: int, n: int, dtype: str, frozen: bool, tied: bool):
  """PyTorch's: `x @ w` (`x @ w.T` of the embedding, tied), then `backward`."""
  import torch  # pylint: disable=g-import-not-at-top
  dt = getattr(torch, dtype)
  gen = torch.Generator().manual_seed(0)
  x = (torch.randn(rows, k, generator=gen) * 0.1).to(dt).requires_grad_(True)
  w = (torch.randn(*((n, k) if tied else (k, n)), generator=gen) * 0.05).to(dt).requires_grad_(not frozen)
  g = torch.randn(rows, n, generator=gen).to(dt)

  def step():
    x.grad = w.grad = None
    (x @ (w.t() if tied else w)).backward(g)
  return step


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--seq", type=int, default=1024)
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
  parser.add_argument("--frozen", action="store_true", help="no weight gradient (LoRA's frozen projections)")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--json", default="")
  args = parser.parse_args(argv)
  host_memory.keep_freed_memory()
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count() or 1)
  rows = args.seq * args.batch
  print(f"SmolLM2-135M's projections at {args.batch} x {args.seq} rows, {args.dtype}, "
        f"{'product and input gradient' if args.frozen else 'product and both gradients'}; {mfu.processor_name()}, "
        f"{os.cpu_count()} cores; JAX {jax.__version__}, PyTorch {torch.__version__}; medians of {args.repeats}")
  print(f"{'projection':>14} {'K x N':>12} {'ours ms':>9} {'PyTorch ms':>11} {'ours GFLOP/s':>13} "
        f"{'PyTorch GFLOP/s':>16} {'ours / PyTorch':>15}")
  table, total = [], {"ours": 0.0, "torch": 0.0}
  for name, k, n, count in SHAPES:
    runs = {side: make(rows, k, n, args.dtype, args.frozen, name == TIED)
            for side, make in (("ours", ours), ("torch", theirs))}
    times = {side: [] for side in runs}
    for _ in range(2):  # each side's calls in a block, after one untimed call: the other library's worker threads,
      for side, run in runs.items():  # still spinning after its last call, would otherwise take the cores
        run()
        for _ in range(args.repeats):
          t0 = time.perf_counter()
          run()
          times[side].append(time.perf_counter() - t0)
    med = {side: float(np.median(t)) for side, t in times.items()}
    flop = 2.0 * rows * k * n * (2 if args.frozen else 3)
    row = {"projection": name, "k": k, "n": n, "per_step": count, "ours_s": med["ours"], "torch_s": med["torch"],
           "ours_gflops": flop / med["ours"] / 1e9, "torch_gflops": flop / med["torch"] / 1e9}
    table.append(row)
    for side in total:
      total[side] += count * med[side]
    print(f"{name:>14} {f'{k} x {n}':>12} {med['ours'] * 1e3:9.1f} {med['torch'] * 1e3:11.1f} "
          f"{row['ours_gflops']:13.1f} {row['torch_gflops']:16.1f} {med['torch'] / med['ours']:14.2f}x", flush=True)
  print(f"{'a step':>14} {'':>12} {total['ours']:8.2f}s {total['torch']:10.2f}s {'':>13} {'':>16} "
        f"{total['torch'] / total['ours']:14.2f}x")
  out = {"machine": {"processor": mfu.processor_name(), "cpu_count": os.cpu_count(), "jax": jax.__version__,
                     "torch": torch.__version__}, "args": vars(args), "shapes": table,
         "step_seconds": total, "ours_speedup": total["torch"] / total["ours"]}
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  main()
