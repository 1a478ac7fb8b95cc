"""Training throughput: our jitted train step vs the same model in `transformers` (PyTorch CPU), same run.

For a tiny and a ~100M-parameter Llama-style decoder: tokens/s of one full optimizer step (forward, backward,
AdamW with clipping) at the same batch and sequence length, the ratio ours / PyTorch (target ≥ 1.2), and MFU:
analytic model FLOPs (`train.mfu`) / step time / the matmul rate measured on this machine in this run, in the
compute dtype (target ≥ 35% for ~100M).

  python benchmarks/train_step.py --json /tmp/train_step.json [--steps 3] [--only tiny] [--profile]
  python benchmarks/train_step.py --json /tmp/train_step_bf16.json --dtype bfloat16

`--dtype bfloat16` computes in bfloat16 with float32 parameters (PyTorch: `torch.autocast`), and also times our
step with bfloat16 product results (`layers.CPU_BF16_FLOAT32_RESULT=False`, the path before float32 results).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import platform
import re
import tempfile
import time

import jax
import numpy as np

from jaxagent import host_memory, sharding
from jaxagent.models import layers
from jaxagent.models.llama import DecoderConfig, init_decoder
from jaxagent.train import mfu
from jaxagent.train.losses import masked_cross_entropy
from jaxagent.train.optim import make_optimizer
from jaxagent.train.state import create_train_state
from jaxagent.train.step import build_train_step, put_batch

CONFIGS = {
    "tiny": dict(cfg=DecoderConfig.tiny(vocab_size=1024, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                                        head_dim=32, intermediate_size=256),
                 batch=8, seq=256),
    "100m": dict(cfg=DecoderConfig.tiny(vocab_size=8192, hidden_size=768, num_layers=12, num_heads=12,
                                        num_kv_heads=12, head_dim=64, intermediate_size=2048,
                                        max_position_embeddings=1024),
                 batch=4, seq=256),
}


class Optim:  # the block configs carry (configs/common.py)
  lr, end_lr_ratio, warmup_steps, b1, b2, eps, weight_decay, clip_norm = 1e-4, 1.0, 0, 0.9, 0.999, 1e-8, 0.0, 1.0


def lm_loss(model, batch, rng):
  del rng
  logits = model(batch["input_ids"])
  loss, _ = masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
  return loss, {}


def _time(fn, steps: int) -> float:
  fn()  # compile / warm up
  fn()
  t0 = time.perf_counter()
  for _ in range(steps):
    fn()
  return (time.perf_counter() - t0) / steps


def _category(shape: tuple[int, ...], cfg, seq: int) -> str:
  """Which part of the step an op's output belongs to, read off its shape."""
  if len(shape) >= 4 and shape[-1] == seq and shape[-2] % seq == 0:  # [B, K, (G,) T or G*T, T]
    return "attention scores / probabilities"
  if cfg.vocab_size in shape:
    return "logits and loss"
  if len(shape) >= 4 and cfg.head_dim in shape:
    return "per-head q / k / v / context"
  if shape and shape[-1] == cfg.intermediate_size:
    return "MLP activations"
  if shape and shape[-1] == cfg.hidden_size:
    return "hidden states, projections, norms"
  return "other (optimizer, small)"


def profile_ours(one, compiled_text: str, cfg, seq: int, steps: int = 5) -> dict:
  """Per-op time of `steps` steps from a `jax.profiler` trace, grouped by what each op's output shape says it
  computes (XLA:CPU records one event per op)."""
  shapes = {m.group(1): tuple(int(d) for d in m.group(2).split(",") if d)
            for m in re.finditer(r"\n\s*(?:ROOT )?%([\w.\-]+) = \w+\[([\d,]*)\]", compiled_text)}
  with tempfile.TemporaryDirectory() as d:
    jax.profiler.start_trace(d, create_perfetto_trace=True)
    for _ in range(steps):
      one()
    jax.profiler.stop_trace()
    with gzip.open(glob.glob(f"{d}/**/perfetto_trace.json.gz", recursive=True)[0]) as f:
      events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  per_op = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e["name"] in shapes:
      per_op[e["name"]] += e["dur"] / steps / 1e3
  by_part = collections.Counter()
  for name, ms in per_op.items():
    by_part[_category(shapes[name], cfg, seq)] += ms
  return {"ms_per_step_by_part": dict(by_part.most_common()),
          "slowest_ops_ms": {f"{n} {list(shapes[n])}": round(ms, 3) for n, ms in per_op.most_common(10)}}


def bench_ours(cfg, ids, steps, profile=False):
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  tx, schedule = make_optimizer(Optim, 100)
  ts = create_train_state(lambda: init_decoder(cfg, 0), tx, mesh)
  batch = {"input_ids": ids[:, :-1], "targets": ids[:, 1:], "loss_mask": np.ones_like(ids[:, 1:])}
  step, b_shard = build_train_step(ts, lm_loss, schedule, mesh, batch)
  device_batch = put_batch(batch, b_shard)
  rng = jax.random.key(0)
  holder = {"state": ts.state}

  def one():
    with jax.set_mesh(mesh):
      holder["state"], metrics = step(holder["state"], device_batch, rng)
    jax.block_until_ready(metrics["loss"])

  t = _time(one, steps)
  if not profile:
    return t, None
  with jax.set_mesh(mesh):
    text = step.lower(holder["state"], device_batch, rng).compile().as_text()
  return t, profile_ours(one, text, cfg, ids.shape[1] - 1)


def bench_torch(cfg, ids, steps):
  import contextlib  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  hf = transformers.LlamaConfig(**cfg.replace(dtype="float32").to_hf())
  model = transformers.LlamaForCausalLM(hf).float().train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
  x = torch.from_numpy(ids.astype(np.int64))
  autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if cfg.dtype == "bfloat16" else contextlib.nullcontext

  def one():
    opt.zero_grad(set_to_none=True)
    with autocast():
      logits = model(input_ids=x[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

  return _time(one, steps)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--json", required=True, help="where to write the figures")
  parser.add_argument("--steps", type=int, default=3, help="timed steps per measurement (after 2 warm-up)")
  parser.add_argument("--only", choices=sorted(CONFIGS), default=None)
  parser.add_argument("--profile", action="store_true", help="also where our step's time goes, by part and op")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                      help="the compute dtype (parameters stay float32)")
  args = parser.parse_args()
  host_memory.keep_freed_memory()  # as `jaxagent.main` runs: freed buffers reused, not mapped afresh

  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count() or 1)
  peak = mfu.measured_matmul_flops(n=2048, dtype=args.dtype)  # the rate of the step's products
  out = {"machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "jax": jax.__version__,
                     "torch": torch.__version__, "jax_device": str(jax.devices()[0]),
                     "load_avg_at_start": os.getloadavg()},
         "measured_matmul_flops": peak, "dtype": args.dtype, "configs": {}}
  for name, spec in CONFIGS.items():
    if args.only and name != args.only:
      continue
    cfg, batch, seq = spec["cfg"].replace(dtype=args.dtype), spec["batch"], spec["seq"]
    ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (batch, seq + 1)).astype(np.int32)
    tokens = batch * seq
    flops = mfu.decoder_flops_per_token(cfg, seq) * tokens
    t_ours, breakdown = bench_ours(cfg, ids, args.steps, args.profile)
    t_torch = bench_torch(cfg, ids, args.steps)
    row = {"params": cfg.num_params, "batch": batch, "seq": seq,
           "ours_tokens_per_s": tokens / t_ours, "torch_tokens_per_s": tokens / t_torch,
           "ratio_ours_over_torch": t_torch / t_ours,
           "ours_mfu_vs_measured_matmul": flops / t_ours / peak, "torch_mfu_vs_measured_matmul": flops / t_torch / peak,
           "ours_step_s": t_ours, "torch_step_s": t_torch}
    if breakdown:
      row["ours_profile"] = breakdown
    if args.dtype == "bfloat16":  # the earlier path: bfloat16 product results
      layers.CPU_BF16_FLOAT32_RESULT = False
      t_bf16_results, _ = bench_ours(cfg, ids, args.steps)
      layers.CPU_BF16_FLOAT32_RESULT = True
      row.update(ours_bf16_results_step_s=t_bf16_results, ratio_f32_results_over_bf16_results=t_bf16_results / t_ours)
    out["configs"][name] = row
    print(f"{name:>5} ({cfg.num_params / 1e6:.1f}M params, batch {batch}x{seq}): ours {row['ours_tokens_per_s']:.0f} "
          f"tok/s, transformers {row['torch_tokens_per_s']:.0f} tok/s, ratio {row['ratio_ours_over_torch']:.2f}x; "
          f"MFU ours {row['ours_mfu_vs_measured_matmul']:.1%} / torch {row['torch_mfu_vs_measured_matmul']:.1%} "
          f"of {peak / 1e9:.1f} GFLOP/s measured")
    if args.dtype == "bfloat16":
      print(f"      float32 product results {row['ratio_f32_results_over_bf16_results']:.2f}x the bfloat16-result path "
            f"({t_ours:.3f} s against {row['ours_bf16_results_step_s']:.3f} s a step)")
    if breakdown:
      total = sum(breakdown["ms_per_step_by_part"].values())
      print(f"  ours, {total:.1f} ms of op time a step: " + ", ".join(
          f"{part} {ms:.1f} ({ms / total:.0%})" for part, ms in breakdown["ms_per_step_by_part"].items()))
  out["machine"]["load_avg_at_end"] = os.getloadavg()
  with open(args.json, "w") as f:
    json.dump(out, f, indent=2)


if __name__ == "__main__":
  main()
