"""How fast XLA:CPU streams weights through a matmul with few rows: the bound on batched decode.

A decode step multiplies M rows (the batch) by every weight matrix once. At M = 1 that is a matrix-vector
product, limited by the memory bandwidth; at M = 8 it should cost the same bytes and 8× the FLOPs, still far
below the matmul rate. This times the ~100M decoder's MLP weights (12 layers × [768, 2048] and [2048, 768],
float32, 151 MB, chained so nothing is hoisted) at M = 1, 2, 4, 8, 16 and reports the weight bytes read per
second, each against M = 1 in the same run.

  python benchmarks/skinny_matmul.py
  XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python benchmarks/skinny_matmul.py   # without YNNPACK
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

LAYERS, EMBED, HIDDEN = 12, 768, 2048


def _best(fn, *args, repeats: int = 20) -> float:
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best


@jax.jit
def _mlp_chain(x, ups, downs):
  for up, down in zip(ups, downs):
    x = jnp.tanh(x @ up) @ down
  return x


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default="1,2,4,8,16")
  parser.add_argument("--json", default=None, help="also write the figures here")
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  ups = [jnp.asarray(rng.standard_normal((EMBED, HIDDEN), np.float32) * 0.02) for _ in range(LAYERS)]
  downs = [jnp.asarray(rng.standard_normal((HIDDEN, EMBED), np.float32) * 0.02) for _ in range(LAYERS)]
  weight_bytes = 4 * LAYERS * 2 * EMBED * HIDDEN
  print(f"load average {os.getloadavg()[0]:.2f}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
  rows, base = [], None
  for m in (int(r) for r in args.rows.split(",")):
    t = _best(_mlp_chain, jnp.ones((m, EMBED), jnp.float32), ups, downs)
    base = t if base is None else base
    row = {"rows": m, "ms": t * 1e3, "weight_gb_per_s": weight_bytes / t / 1e9,
           "gflop_per_s": 2 * m * weight_bytes / 4 / t / 1e9, "time_vs_first": t / base}
    rows.append(row)
    print(f"M={m:3d}: {row['ms']:6.2f} ms, weights {row['weight_gb_per_s']:5.1f} GB/s, "
          f"{row['gflop_per_s']:6.1f} GFLOP/s, {row['time_vs_first']:.2f}x the time of M={rows[0]['rows']}",
          flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"benchmark": "skinny_matmul", "xla_flags": os.environ.get("XLA_FLAGS", ""), "rows": rows}, f,
                indent=2)


if __name__ == "__main__":
  main()
