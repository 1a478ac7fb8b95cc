"""One layer's causal attention, forward and backward, at SmolLM2-135M's shapes (9 query heads over 3 key heads of
64): our kernels (`layers.flash_attention`, `layers.causal_block_attention`) against PyTorch's
`scaled_dot_product_attention` in the same run. At 4,096 tokens attention is over half of a SmolLM2 training step
on CPU (docs/results/performance.md#projections).

  python benchmarks/attention.py [--seqs 1024,4096] [--batch 2] [--dtype bfloat16] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's jaxagent

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxagent import host_memory  # noqa: E402
from jaxagent.models import layers  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def _best(fn, repeats: int) -> float:
  fn()  # compiles, or warms PyTorch's kernels
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def ours(kernel: str, batch: int, seq: int, dtype: str, repeats: int) -> float:
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (batch, seq, HEADS, HEAD_DIM), dtype)
  k, v = (jax.random.normal(key, (batch, seq, KV_HEADS, HEAD_DIM), dtype) for key in keys[1:3])
  w = jax.random.normal(keys[3], q.shape, dtype)
  mask = layers.SelfMask(jnp.ones((batch, seq), bool), jnp.broadcast_to(jnp.arange(seq), (batch, seq)), None, None)
  attend = {"flash": lambda q, k, v: layers.flash_attention(q, k, v, mask),
            "xla": lambda q, k, v: layers.causal_block_attention(q, k, v, mask.dense())}[kernel]
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum((attend(q, k, v) * w).astype(jnp.float32)), argnums=(0, 1, 2)))
  return _best(lambda: jax.block_until_ready(grad(q, k, v)), repeats)


def torch_sdpa(batch: int, seq: int, dtype: str, repeats: int) -> float:
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  dt = getattr(torch, dtype)
  q = torch.randn(batch, HEADS, seq, HEAD_DIM, dtype=dt, requires_grad=True)
  k, v = (torch.randn(batch, KV_HEADS, seq, HEAD_DIM, dtype=dt, requires_grad=True) for _ in range(2))
  w = torch.randn(batch, HEADS, seq, HEAD_DIM, dtype=dt)

  def step():
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    (out * w).float().sum().backward()
    q.grad = k.grad = v.grad = None

  return _best(step, repeats)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seqs", default="1024,4096")
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
  parser.add_argument("--repeats", type=int, default=5, help="timed calls per kernel (the best is kept)")
  parser.add_argument("--no-torch", action="store_true", help="ours only")
  parser.add_argument("--json", default="")
  args = parser.parse_args()
  kept = host_memory.keep_freed_memory()
  out = {"machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor(),
                     "jax": jax.__version__, "freed_memory_kept": kept, "load_avg_at_start": os.getloadavg()},
         "batch": args.batch, "dtype": args.dtype, "rows": []}
  flops = lambda seq: 2 * 2 * args.batch * HEADS * HEAD_DIM * seq * seq / 2 * 3.5  # causal: fwd 2, bwd 5 products
  for seq in (int(s) for s in args.seqs.split(",")):
    row = {"seq": seq, "causal_gflop": flops(seq) / 1e9}
    for kernel in ("flash", "xla"):
      row[kernel + "_s"] = ours(kernel, args.batch, seq, args.dtype, args.repeats)
    if not args.no_torch:
      row["torch_sdpa_s"] = torch_sdpa(args.batch, seq, args.dtype, args.repeats)
    out["rows"].append(row)
    line = f"seq {seq}: flash {row['flash_s'] * 1e3:.0f} ms, xla {row['xla_s'] * 1e3:.0f} ms"
    if "torch_sdpa_s" in row:
      line += (f", PyTorch sdpa {row['torch_sdpa_s'] * 1e3:.0f} ms; PyTorch / ours: flash "
               f"{row['torch_sdpa_s'] / row['flash_s']:.2f}x, xla {row['torch_sdpa_s'] / row['xla_s']:.2f}x")
    print(line + f" (one layer, batch {args.batch}, {args.dtype}, forward and backward)", flush=True)
  out["machine"]["load_avg_at_end"] = os.getloadavg()
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
