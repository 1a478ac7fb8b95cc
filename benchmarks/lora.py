"""LoRA vs full fine-tuning of SmolLM2-135M-Instruct (`model.hf_checkpoint=smollm2`), same run, same batch.

Both start from the pretrained weights through `models.build` (the LoRA one with fresh rank-r adapters on the
default targets) and run our jitted train step (AdamW, clipping) on one device. Reported per mode: the mean step
time after two warm-up steps, the compiled step's memory (`memory_analysis()`: arguments = model + optimizer state
+ batch, and XLA's temporaries: activations, gradients, updates), the optimizer state's bytes and the trained
parameter count; then LoRA / full ratios. With `--torch`, the same two modes in PyTorch + transformers in the same
run (the same checkpoint directory, adapters of the same rank, alpha and targets on frozen weights, AdamW, clipping;
`torch.autocast` for bfloat16) and ours / PyTorch per mode.

  python benchmarks/lora.py [--rank 8] [--batch 2] [--seq 256] [--steps 3] [--dtype bfloat16] [--attention flash]
                            [--remat full] [--torch] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import jax
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for configs/

# pylint: disable=g-import-not-at-top,wrong-import-position
from configs import il as il_config  # noqa: E402
from jaxagent import host_memory, models, sharding  # noqa: E402
from jaxagent.data.tokenizer import load_tokenizer  # noqa: E402
from jaxagent.models.hf import gguf  # noqa: E402
from jaxagent.train.losses import masked_cross_entropy  # noqa: E402
from jaxagent.train.optim import make_optimizer  # noqa: E402
from jaxagent.train.state import create_train_state_from_model  # noqa: E402
from jaxagent.train.step import build_train_step, put_batch  # noqa: E402


def lm_loss(model, batch, rng):
  del rng
  loss, _ = masked_cross_entropy(model(batch["input_ids"]), batch["targets"], batch["loss_mask"])
  return loss, {}


def _config(rank: int, seq: int, dtype: str = "float32", attention: str = "xla", remat: str = "none"):
  config = il_config.get_config("text")
  config.model.hf_checkpoint = "smollm2"
  config.model.lora.rank = rank
  config.model.dtype = dtype
  config.model.attention = attention
  config.model.remat = remat
  config.data.seq_len = seq
  config.optim.update(lr=1e-4, warmup_steps=0)
  return config


def _nbytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def measure(rank: int, batch: int, seq: int, steps: int, tokenizer, dtype: str = "float32",
            attention: str = "xla", remat: str = "none") -> dict:
  config = _config(rank, seq, dtype, attention, remat)
  built = models.build(config, tokenizer)
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  tx, schedule = make_optimizer(config.optim, 100)
  ts = create_train_state_from_model(built.pretrained(), tx, mesh, wrt=built.trainable)
  vocab = ts.model().config.vocab_size
  ids = np.random.RandomState(0).randint(0, vocab, (batch, seq + 1)).astype(np.int32)
  host = {"input_ids": ids[:, :-1], "targets": ids[:, 1:], "loss_mask": np.ones_like(ids[:, 1:])}
  step, b_shard = build_train_step(ts, lm_loss, schedule, mesh, host, wrt=built.trainable)
  device_batch, rng = put_batch(host, b_shard), jax.random.key(0)
  with jax.set_mesh(mesh):
    mem = step.lower(ts.state, device_batch, rng).compile().memory_analysis()
  trained = nnx.state(ts.model(), built.trainable)
  row = {"rank": rank, "trained_params": sum(x.size for x in jax.tree.leaves(trained)),
         "trained_bytes": _nbytes(trained), "optimizer_state_bytes": _nbytes(ts.state[1]),
         "model_bytes": _nbytes(ts.state[0]),
         "compiled_argument_bytes": int(mem.argument_size_in_bytes), "compiled_temp_bytes": int(mem.temp_size_in_bytes),
         "compiled_output_bytes": int(mem.output_size_in_bytes), "compiled_alias_bytes": int(mem.alias_size_in_bytes)}
  row["compiled_argument_plus_temp_bytes"] = row["compiled_argument_bytes"] + row["compiled_temp_bytes"]
  state, times, losses = ts.state, [], []
  for i in range(steps + 2):
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
      state, metrics = step(state, device_batch, rng)
    losses.append(float(metrics["loss"]))  # waits for the step
    if i >= 2:  # the first compiles, the second settles
      times.append(time.perf_counter() - t0)
  row.update(step_s=float(np.mean(times)), step_s_all=times, losses=losses,
             tokens_per_s=batch * seq / float(np.mean(times)))
  return row


def measure_torch(rank: int, batch: int, seq: int, steps: int, dtype: str) -> dict:
  """The same step in PyTorch: full fine-tuning (rank 0) or rank-`rank` adapters on `models.DEFAULT_LORA_TARGETS`
  of the frozen checkpoint (x A B · alpha / rank, A Gaussian, B zero, as `models.lora`)."""
  import contextlib  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  config = _config(rank, seq, dtype)
  model = transformers.AutoModelForCausalLM.from_pretrained(gguf.checkpoint_dir("smollm2"), dtype=torch.float32)
  model.train()
  if rank:
    targets = {t.strip() for t in str(config.model.lora.get("targets", models.DEFAULT_LORA_TARGETS)).split(",")}
    scale = float(config.model.lora.alpha) / rank
    for p in model.parameters():
      p.requires_grad_(False)

    class Adapted(torch.nn.Module):
      def __init__(self, base):
        super().__init__()
        self.base = base
        self.a = torch.nn.Parameter(torch.randn(base.in_features, rank) / base.in_features ** 0.5)
        self.b = torch.nn.Parameter(torch.zeros(rank, base.out_features))

      def forward(self, x):
        return self.base(x) + (x @ self.a @ self.b) * scale

    for _, module in list(model.named_modules()):
      for child, linear in list(module.named_children()):
        if child in targets and isinstance(linear, torch.nn.Linear):
          setattr(module, child, Adapted(linear))
  trained = [p for p in model.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(trained, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
  ids = torch.from_numpy(np.random.RandomState(0).randint(0, model.config.vocab_size, (batch, seq + 1)).astype(np.int64))
  autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype == "bfloat16" else contextlib.nullcontext
  times, losses = [], []
  for i in range(steps + 2):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with autocast():
      logits = model(input_ids=ids[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trained, 1.0)
    opt.step()
    losses.append(float(loss))
    if i >= 2:
      times.append(time.perf_counter() - t0)
  return {"rank": rank, "trained_params": sum(p.numel() for p in trained), "step_s": float(np.mean(times)),
          "step_s_all": times, "losses": losses, "tokens_per_s": batch * seq / float(np.mean(times))}


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rank", type=int, default=8)
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--seq", type=int, default=256)
  parser.add_argument("--steps", type=int, default=3, help="timed steps per mode (after 2 warm-up)")
  parser.add_argument("--json", default="", help="where to write the figures (optional)")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                      help="the compute dtype (parameters stay float32)")
  parser.add_argument("--attention", choices=("xla", "flash"), default="xla",
                      help="our attention kernel (config.model.attention); PyTorch runs its default (sdpa)")
  parser.add_argument("--remat", choices=("none", "full", "dots", "dots_no_batch", "projections"), default="none",
                      help="our recomputation policy (config.model.remat); PyTorch keeps every activation")
  parser.add_argument("--torch", action="store_true", help="also both modes in PyTorch + transformers, same run")
  parser.add_argument("--heap", choices=("keep", "glibc"), default="keep",
                      help="keep: freed memory stays in the process (jaxagent.host_memory, both sides); glibc: its "
                           "defaults, large buffers mapped afresh at every allocation")
  args = parser.parse_args()
  kept = host_memory.keep_freed_memory() if args.heap == "keep" else False

  tokenizer = load_tokenizer(gguf.checkpoint_dir("smollm2"), require_image_token=False)
  out = {"machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "jax": jax.__version__,
                     "device": str(jax.devices()[0]), "load_avg_at_start": os.getloadavg(), "freed_memory_kept": kept},
         "batch": args.batch, "seq": args.seq, "dtype": args.dtype, "attention": args.attention, "remat": args.remat}
  full = measure(0, args.batch, args.seq, args.steps, tokenizer, args.dtype, args.attention, args.remat)
  lora = measure(args.rank, args.batch, args.seq, args.steps, tokenizer, args.dtype, args.attention, args.remat)
  out.update(full=full, lora=lora)
  out["ratio_lora_over_full"] = {k: lora[k] / full[k] for k in (
      "step_s", "trained_params", "optimizer_state_bytes", "compiled_temp_bytes", "compiled_argument_bytes",
      "compiled_argument_plus_temp_bytes")}
  out["machine"]["load_avg_at_end"] = os.getloadavg()
  mib = lambda b: f"{b / 2**20:.0f} MiB"
  for name, row in (("full", full), (f"lora r={args.rank}", lora)):
    print(f"{name:>10}: step {row['step_s']:.2f} s ({row['tokens_per_s']:.0f} tok/s), trains "
          f"{row['trained_params'] / 1e6:.2f}M params, optimizer state {mib(row['optimizer_state_bytes'])}, "
          f"compiled args {mib(row['compiled_argument_bytes'])} + temp {mib(row['compiled_temp_bytes'])}")
  print(f"first-step loss (before any update; fresh adapters change nothing): full {full['losses'][0]:.6f}, "
        f"lora {lora['losses'][0]:.6f}; last: full {full['losses'][-1]:.4f}, lora {lora['losses'][-1]:.4f}")
  r = out["ratio_lora_over_full"]
  print(f"LoRA / full (batch {args.batch}x{args.seq}): step time {r['step_s']:.2f}x, optimizer state "
        f"{r['optimizer_state_bytes']:.4f}x, compiled temp {r['compiled_temp_bytes']:.2f}x, args + temp "
        f"{r['compiled_argument_plus_temp_bytes']:.2f}x, trained params {r['trained_params']:.4f}x")
  if args.json:  # ours kept, should PyTorch's side not fit in memory
    with open(args.json, "w") as f:
      json.dump(out, f, indent=2)
  if args.torch:
    import torch  # pylint: disable=g-import-not-at-top
    torch.set_num_threads(os.cpu_count() or 1)
    out["torch"] = {"version": torch.__version__,
                    "full": measure_torch(0, args.batch, args.seq, args.steps, args.dtype),
                    "lora": measure_torch(args.rank, args.batch, args.seq, args.steps, args.dtype)}
    out["ratio_ours_over_torch"] = {m: out["torch"][m]["step_s"] / out[m]["step_s"] for m in ("full", "lora")}
    out["machine"]["load_avg_at_end"] = os.getloadavg()
    for m in ("full", "lora"):
      t = out["torch"][m]
      print(f"{m:>10} in PyTorch {out['torch']['version']} ({args.dtype}): step {t['step_s']:.2f} s, trains "
            f"{t['trained_params'] / 1e6:.2f}M params; ours / PyTorch {out['ratio_ours_over_torch'][m]:.2f}x")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=2)


if __name__ == "__main__":
  main()
