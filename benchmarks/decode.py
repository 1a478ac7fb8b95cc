"""Decode throughput: our one-jit KV-cache sampler vs `transformers` `generate` (PyTorch CPU), same weights.

For each config (tiny, ~100M) and batch size (1, 8): a random Llama is built in `transformers`, saved as a
local checkpoint and loaded by `models.hf.llama.load_pretrained`, so both sides run identical float32
weights. Both decode greedily exactly `--new_tokens` tokens (no EOS) after a `--prompt_len` prompt; each
side is warmed up once (compilation / first call excluded) and timed `--repeats` times, interleaved, best
time kept. Prints tokens/s and ours/transformers, and writes everything to `--json`.

Decode at small batch is bound by memory bandwidth: each step reads every weight and the valid KV cache once.
The machine's bandwidth is measured in the same run (`measure_bandwidth`: the best of three jitted reads of a
1 GiB array and a NumPy copy, each byte read or written counted once), and each row reports the bytes a step
must read × steps/s as a fraction of it (`bandwidth_fraction`).

  python benchmarks/decode.py --json /tmp/decode.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from jaxagent import host_memory
from jaxagent.models import llama, sampler
from jaxagent.models.hf import llama as hf_llama

CONFIGS = {
    "tiny": llama.DecoderConfig.tiny(vocab_size=512),
    # ~100M parameters, Llama-style proportions (tied embeddings, GQA 12/4).
    "small_100m": llama.DecoderConfig(vocab_size=32000, hidden_size=768, num_layers=12, num_heads=12,
                                      num_kv_heads=4, head_dim=64, intermediate_size=2048,
                                      tie_word_embeddings=True, max_position_embeddings=2048),
}


def _timed(fn) -> tuple[float, float]:
  """(wall seconds, process CPU seconds): the CPU figure is robust to other jobs sharing the machine."""
  wall, cpu = time.perf_counter(), time.process_time()
  fn()
  return time.perf_counter() - wall, time.process_time() - cpu


def measure_bandwidth(gib: float = 1.0, repeats: int = 5) -> dict:
  """Bytes/s this machine's memory moves, over `gib` GiB, far beyond the caches: jitted reads (a sum, row sums and
  a matrix-vector product, each over its own fresh array and each byte read once) and a NumPy copy (each byte read
  and written once); the best of `repeats` each, and the best of all as the reference. On the shared 2-core
  machine the same jitted sum read ~35 GB/s in one process and ~70 in the next, so several arrays and kernels give
  the reference its best chance to find the limit."""
  n = int(gib * 2**30) // 4
  reads = {"jax_read_bytes_per_s": (jnp.sum, (n,)), "jax_row_sums_bytes_per_s": (lambda a: a.sum(1), (256, n // 256)),
           "jax_matvec_bytes_per_s": (lambda a: a @ jnp.ones(a.shape[1], a.dtype), (n // 1024, 1024))}
  out = {}
  for key, (fn, shape) in reads.items():
    x, read = jnp.ones(shape, jnp.float32), jax.jit(fn)
    jax.block_until_ready(read(x))
    out[key] = 4 * n / min(_timed(lambda: jax.block_until_ready(read(x)))[0] for _ in range(repeats))
    del x
  src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
  copy_s = min(_timed(lambda: np.copyto(dst, src))[0] for _ in range(repeats))
  out["numpy_copy_bytes_per_s"] = 2 * 4 * n / copy_s
  out["bytes_per_s"] = max(out.values())
  return out


def step_bytes(cfg: llama.DecoderConfig, batch: int, prompt_len: int, new_tokens: int) -> float:
  """What one decode step must read: every weight once, and each row's KV cache at its mean valid length
  (float32)."""
  kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
  return 4 * cfg.num_params + batch * kv_per_token * (prompt_len + new_tokens / 2)


def bench_one(name: str, cfg: llama.DecoderConfig, batch: int, prompt_len: int, new_tokens: int,
              repeats: int, bandwidth: float) -> dict:
  torch.manual_seed(0)
  hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf())
  hf_model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32).eval()
  with tempfile.TemporaryDirectory() as path:
    hf_model.save_pretrained(path)
    model, _ = hf_llama.load_pretrained(path)

  ids = np.random.default_rng(0).integers(3, cfg.vocab_size, size=(batch, prompt_len)).astype(np.int32)
  config = sampler.SamplingConfig(max_new_tokens=new_tokens, temperature=0.0)
  ids_j, mask_j = jnp.asarray(ids), jnp.ones(ids.shape, bool)
  ids_t = torch.tensor(ids, dtype=torch.long)

  def ours():
    return jax.block_until_ready(sampler.sample(model, ids_j, mask_j, config))

  def theirs():
    with torch.inference_mode():
      return hf_model.generate(ids_t, attention_mask=torch.ones_like(ids_t), do_sample=False,
                               max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)

  compile_s = _timed(ours)[0]
  ours_tokens = np.asarray(ours().tokens)
  theirs_tokens = theirs().numpy()[:, prompt_len:]
  ours_s, theirs_s = [], []
  for _ in range(repeats):
    ours_s.append(_timed(ours))
    theirs_s.append(_timed(theirs))
  agree = [int(np.argmin(np.append(a == b, False))) for a, b in zip(ours_tokens, theirs_tokens)]
  (ours_wall, ours_cpu), (theirs_wall, theirs_cpu) = min(ours_s), min(theirs_s)
  result = dict(config=name, params=cfg.num_params, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
                ours_s=ours_wall, transformers_s=theirs_wall, ours_cpu_s=ours_cpu, transformers_cpu_s=theirs_cpu,
                ours_first_call_s=compile_s, ours_tokens_per_s=batch * new_tokens / ours_wall,
                transformers_tokens_per_s=batch * new_tokens / theirs_wall,
                greedy_prefix_agreement=min(agree))
  result["ratio"] = result["ours_tokens_per_s"] / result["transformers_tokens_per_s"]
  result["step_bytes"] = step_bytes(cfg, batch, prompt_len, new_tokens)
  result["bandwidth_fraction"] = result["step_bytes"] * new_tokens / ours_wall / bandwidth
  result["cpu_time_ratio"] = theirs_cpu / ours_cpu
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", required=True, help="where to write the results")
  parser.add_argument("--configs", default=",".join(CONFIGS))
  parser.add_argument("--batches", default="1,8")
  parser.add_argument("--prompt_len", type=int, default=32)
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  host_memory.keep_freed_memory()  # as `jaxagent.main` runs: freed buffers reused, not mapped afresh

  bandwidth = measure_bandwidth()
  print(f"memory bandwidth: {bandwidth['bytes_per_s'] / 1e9:.1f} GB/s (" + ", ".join(
      f"{k.removesuffix('_bytes_per_s')} {v / 1e9:.1f}" for k, v in bandwidth.items() if k != "bytes_per_s") + ")",
        flush=True)
  results = []
  for name in args.configs.split(","):
    for batch in (int(b) for b in args.batches.split(",")):
      r = bench_one(name, CONFIGS[name], batch, args.prompt_len, args.new_tokens, args.repeats,
                    bandwidth["bytes_per_s"])
      results.append(r)
      print(f"{name:>11} ({r['params'] / 1e6:6.1f}M) batch {batch}: ours {r['ours_tokens_per_s']:9.1f} tok/s, "
            f"transformers {r['transformers_tokens_per_s']:9.1f} tok/s, ratio {r['ratio']:.2f}x "
            f"(CPU-time ratio {r['cpu_time_ratio']:.2f}x), {100 * r['bandwidth_fraction']:.0f} % of the bandwidth "
            f"(greedy agreement {r['greedy_prefix_agreement']}/{args.new_tokens} tokens)", flush=True)
  out = dict(benchmark="decode", backend=jax.default_backend(), devices=len(jax.devices()),
             cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(), machine=platform.machine(),
             jax=jax.__version__, torch=torch.__version__, transformers=transformers.__version__,
             load_average=os.getloadavg(), bandwidth=bandwidth, results=results)
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  with open(args.json, "w") as f:
    json.dump(out, f, indent=2)
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
