"""A prompt prefilled after the keys an earlier one left (the prefix cache) against the same prompt prefilled whole,
SmolLM2-135M-Instruct, alternating in one process.

An episode's next prompt begins as the last one did (the task, the actions so far) and differs in the page: with
`Engine(prefix_cache_bytes=)` (`jaxagent.evaluate --prefix-cache-mb`) the engine keeps the earlier prompt's keys
and prefills the rest after them (`sampler._prefill_after`), as it would here: the reuse cut so the row is no
wider than the prompt alone (`serving.engine.fit_prefix`), the rest padded to its own width. Random token ids
(the cost does not depend on them); the last token's logits of both are compared.

  python benchmarks/prefill_after.py [--shared 450] [--rest 1300] [--dtype bfloat16] [--repeats 5] [--no-fit]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's jaxagent

# pylint: disable=g-import-not-at-top,wrong-import-position
from jaxagent import host_memory
from jaxagent.models import sampler
from jaxagent.models.hf import gguf
from jaxagent.models.hf import llama as hf_llama
from jaxagent.serving import engine as engine_lib
from jaxagent.serving.engine import prompt_bucket


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--shared", type=int, default=450, help="tokens the prompt shares with the cached one")
  parser.add_argument("--rest", type=int, default=1300, help="tokens after them")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--no-fit", action="store_true",
                      help="reuse every shared token, the row widened past the prompt's own width (the engine before "
                      "3f4db52; this file also runs in a checkout from before then)")
  args = parser.parse_args(argv)
  host_memory.keep_freed_memory()
  model, _ = hf_llama.load_pretrained(gguf.smollm2_hf_dir(), dtype=args.dtype, param_dtype=args.dtype)
  rng = np.random.default_rng(0)
  n = args.shared + args.rest
  earlier = rng.integers(100, 40000, args.shared + 400)
  prompt = np.concatenate([earlier[:args.shared], rng.integers(100, 40000, args.rest)])
  _, prefix = sampler._prefill_row(model, jnp.asarray(earlier[None], jnp.int32),  # pylint: disable=protected-access
                                   jnp.ones((1, len(earlier)), bool), None)
  hit = (prefix, args.shared) if args.no_fit else engine_lib.fit_prefix((prefix, args.shared), n)
  if hit is None:
    parser.error(f"--shared={args.shared} --rest={args.rest}: the rest alone pads to the prompt's width; the engine "
                 "would prefill it whole")
  shared = hit[1]
  whole_width, rest_width = prompt_bucket(n), prompt_bucket(n - shared)

  def padded(tokens, width):
    ids = np.zeros((1, width), np.int32)
    ids[0, :len(tokens)] = tokens
    return jnp.asarray(ids), jnp.asarray(np.arange(width)[None] < len(tokens))

  whole_ids, whole_mask = padded(prompt, whole_width)
  rest_ids, rest_mask = padded(prompt[shared:], rest_width)
  length = prompt_bucket(shared + rest_width)
  # pylint: disable=protected-access
  runs = {"whole": lambda: sampler._prefill_row(model, whole_ids, whole_mask, None)[0],
          "after": lambda: sampler._prefill_after(model, prefix, jnp.int32(shared), rest_ids, rest_mask,
                                                  length=length)[0]}
  # pylint: enable=protected-access
  logits = {k: jax.block_until_ready(run()) for k, run in runs.items()}
  times = {k: [] for k in runs}
  for _ in range(args.repeats):
    for k, run in runs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(run())
      times[k].append(time.perf_counter() - t0)
  med = {k: float(np.median(t)) for k, t in times.items()}
  out = {"tokens": n, "shared": args.shared, "reused": shared, "whole_width": whole_width, "rest_width": rest_width,
         "row": length, "seconds": med, "speedup": med["whole"] / med["after"],
         "max_logit_difference": float(jnp.max(jnp.abs(logits["whole"] - logits["after"]))),
         "same_argmax": bool(jnp.argmax(logits["whole"]) == jnp.argmax(logits["after"]))}
  print(f"{n} tokens, {args.dtype}: whole at width {whole_width} {med['whole']:.3f} s; after {shared} cached of "
        f"{args.shared} shared, the rest at width {rest_width} in a row of {length}: {med['after']:.3f} s "
        f"({out['speedup']:.2f}x); medians of {args.repeats}; largest logit difference "
        f"{out['max_logit_difference']:.3f}, same argmax: {out['same_argmax']}")
  return out


if __name__ == "__main__":
  main()
