"""The compute figures on an accelerator: a ~1B-parameter decoder's train step (MFU) and decode (fraction of HBM
bandwidth), each beside PyTorch + `transformers` on the same device in the same run.

Measured first, in the same run: the device's dense bf16 matmul rate (8192³, best of 10) and its memory bandwidth
(a jitted copy of 4 GiB, bytes read + written). MFU is reported against both that measured rate and the
device's nominal dense bf16 peak (`train.mfu.KNOWN_PEAKS`). Decode reads every bf16 weight and the valid KV cache
once a step; `bandwidth_fraction` = those bytes × steps/s / the measured bandwidth.

Also: grouped-query attention, forward + backward at the train shape, ours (`layers.dot_product_attention`, the
XLA path) against `jax.nn.dot_product_attention` (cuDNN's fused kernel where the backend offers it).

  python benchmarks/accelerator.py --json /tmp/accel.json            # on a GPU: the 1B figures
  python benchmarks/accelerator.py --json /tmp/accel.json --size tiny  # anywhere: the same code on a tiny model

Nothing in the project depends on an accelerator; this is where its figures come from
(`docs/results/performance.md`).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # PyTorch shares the device in the same run

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxagent import sharding  # noqa: E402
from jaxagent.models import layers, llama, sampler  # noqa: E402
from jaxagent.train import mfu  # noqa: E402
from jaxagent.train.losses import masked_cross_entropy  # noqa: E402
from jaxagent.train.optim import make_optimizer  # noqa: E402
from jaxagent.train.state import create_train_state  # noqa: E402
from jaxagent.train.step import build_train_step, put_batch  # noqa: E402

# Llama-3.2-1B's shape with a 32k vocabulary (1.04B parameters, tied embeddings).
SIZES = {
    "1b": dict(cfg=dict(vocab_size=32000, hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8,
                        head_dim=64, intermediate_size=8192, tie_word_embeddings=True,
                        max_position_embeddings=4096),
               train_batch=8, train_seq=1024, prompt_len=128, new_tokens=256, matmul_n=8192, bandwidth_gib=4.0),
    "tiny": dict(cfg=dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                          intermediate_size=128, tie_word_embeddings=True, max_position_embeddings=512),
                 train_batch=2, train_seq=64, prompt_len=8, new_tokens=16, matmul_n=256, bandwidth_gib=0.0625),
}


class Optim:  # the block configs carry (configs/common.py)
  lr, end_lr_ratio, warmup_steps, b1, b2, eps, weight_decay, clip_norm = 1e-4, 1.0, 0, 0.9, 0.999, 1e-8, 0.0, 1.0


def _best(fn, repeats: int) -> float:
  fn()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def device_limits(n: int, gib: float) -> dict:
  """The matmul rate (bf16, n³) and memory bandwidth (jitted copy, read + write) of device 0, measured now."""
  a = jnp.ones((n, n), jnp.bfloat16)
  mm = jax.jit(lambda x, y: x @ y)
  t_mm = _best(lambda: mm(a, a).block_until_ready(), 10)
  x = jnp.ones((int(gib * 2**30) // 4,), jnp.float32)
  copy = jax.jit(lambda v: v * 1.0001)  # not elided; one read, one write per element
  t_copy = _best(lambda: copy(x).block_until_ready(), 10)
  del a, x
  return {"bf16_matmul_flops": 2.0 * n**3 / t_mm, "bandwidth_bytes_per_s": 2 * gib * 2**30 / t_copy,
          "nominal_bf16_flops": mfu.device_peak_flops()}


def lm_loss(model, batch, rng):
  del rng
  logits = model(batch["input_ids"])
  loss, _ = masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
  return loss, {}


def train_ours(cfg: llama.DecoderConfig, ids: np.ndarray, steps: int) -> float:
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  tx, schedule = make_optimizer(Optim, 100)
  ts = create_train_state(lambda: llama.init_decoder(cfg, 0), tx, mesh)
  batch = {"input_ids": ids[:, :-1], "targets": ids[:, 1:], "loss_mask": np.ones_like(ids[:, 1:])}
  step, b_shard = build_train_step(ts, lm_loss, schedule, mesh, batch)
  device_batch = put_batch(batch, b_shard)
  holder, losses = {"state": ts.state}, []
  rng = jax.random.key(0)

  def one():
    with jax.set_mesh(mesh):
      holder["state"], metrics = step(holder["state"], device_batch, rng)
    losses.append(jax.block_until_ready(metrics["loss"]))

  t = _best(one, steps)
  loss = float(losses[0])
  del holder, ts, device_batch
  gc.collect()
  return t, loss


def masked_parity(implementation: str) -> dict:
  """The fused path against ours on padded GQA batches (full, right- and left-padded rows; bf16), output and
  gradients, at the positions a loss reads."""
  keys = jax.random.split(jax.random.key(1), 3)
  b, t, h, kv, d = 3, 256, 8, 2, 64
  q = jax.random.normal(keys[0], (b, t, h, d), jnp.bfloat16)
  k = jax.random.normal(keys[1], (b, t, kv, d), jnp.bfloat16)
  v = jax.random.normal(keys[2], (b, t, kv, d), jnp.bfloat16)
  valid = jnp.arange(t)[None] < jnp.array([t, t - 100, t])[:, None]
  valid = valid.at[2].set(jnp.arange(t) >= 60)
  slots = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask = layers.attention_mask(slots, slots, valid)
  real = valid[:, :, None, None]
  loss = lambda f: lambda q, k, v: jnp.sum(jnp.where(real, f(q, k, v), 0).astype(jnp.float32) ** 2)
  ours = jax.jit(jax.value_and_grad(loss(lambda q, k, v: layers.dot_product_attention(q, k, v, mask)), (0, 1, 2)))
  fused = jax.jit(jax.value_and_grad(loss(lambda q, k, v: layers.fused_causal_attention(
      q, k, v, mask, implementation)), (0, 1, 2)))
  (a, ga), (f, gf) = ours(q, k, v), fused(q, k, v)
  rel = lambda x, y: float(jnp.linalg.norm((x - y).astype(jnp.float32)) / jnp.linalg.norm(y.astype(jnp.float32)))
  return {"loss_rel_diff": abs(float(f) - float(a)) / abs(float(a)),
          "grad_rel_diff": max(rel(x, y) for x, y in zip(gf, ga))}


def train_torch(cfg: llama.DecoderConfig, ids: np.ndarray, steps: int) -> float:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg.to_hf())).float().to(dev).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                          fused=dev == "cuda")
  x = torch.from_numpy(ids.astype(np.int64)).to(dev)

  losses = []

  def one():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev, dtype=torch.bfloat16):
      logits = model(input_ids=x[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if dev == "cuda":
      torch.cuda.synchronize()
    losses.append(loss.detach())

  t = _best(one, steps)
  first_loss = float(losses[0])
  del model, opt
  gc.collect()
  if dev == "cuda":
    torch.cuda.empty_cache()
  return t, first_loss


def attention(cfg: llama.DecoderConfig, batch: int, seq: int, repeats: int) -> dict:
  """Forward + backward of causal GQA at the train shape, bf16: ours vs `jax.nn.dot_product_attention`."""
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (batch, seq, cfg.num_heads, cfg.head_dim), jnp.bfloat16)
  k = jax.random.normal(keys[1], (batch, seq, cfg.num_kv_heads, cfg.head_dim), jnp.bfloat16)
  v = jax.random.normal(keys[2], (batch, seq, cfg.num_kv_heads, cfg.head_dim), jnp.bfloat16)
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((seq, seq), bool)), (batch, 1, seq, seq))
  impls = {"ours_xla": lambda q, k, v: layers.dot_product_attention(q, k, v, mask)}
  impls["jax_nn_xla"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
  if jax.default_backend() == "gpu":
    impls["jax_nn_cudnn"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                                         implementation="cudnn")
  out, ref = {}, None
  for name, fn in impls.items():
    grad = jax.jit(jax.value_and_grad(lambda q, k, v, f=fn: jnp.sum(f(q, k, v).astype(jnp.float32)),
                                      argnums=(0, 1, 2)))
    try:
      val, _ = grad(q, k, v)
      out[name + "_s"] = _best(lambda: jax.block_until_ready(grad(q, k, v)), repeats)
      ref = val if ref is None else ref
      out[name + "_rel_diff_vs_ours"] = float(abs(val - ref) / (abs(ref) + 1e-6))
    except Exception as e:  # pylint: disable=broad-except
      out[name + "_error"] = f"{type(e).__name__}: {e}"[:300]
  return out


def decode(cfg: llama.DecoderConfig, batch: int, prompt_len: int, new_tokens: int, repeats: int,
           bandwidth: float) -> dict:
  """Greedy decode of exactly `new_tokens` (no EOS) with bf16 weights and cache: ours vs `generate`."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  bf16 = dataclasses.replace(cfg, dtype="bfloat16", param_dtype="bfloat16")
  model = llama.init_decoder(bf16, 0)
  ids = np.random.default_rng(0).integers(3, cfg.vocab_size, size=(batch, prompt_len)).astype(np.int32)
  config = sampler.SamplingConfig(max_new_tokens=new_tokens, temperature=0.0)
  ids_j, mask_j = jnp.asarray(ids), jnp.ones(ids.shape, bool)
  ours_s = _best(lambda: jax.block_until_ready(sampler.sample(model, ids_j, mask_j, config)), repeats)
  pad = sampler.decode_pad_rows(batch)
  if pad:  # the same decode without the padded row, for the ratio it buys
    unpadded_s = _best(lambda: jax.block_until_ready(sampler.sample(model, ids_j, mask_j, config, pad_rows=0)),
                       repeats)
  kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
  step_bytes = 2 * cfg.num_params + batch * kv_per_token * (prompt_len + new_tokens / 2)
  row = {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, "ours_s": ours_s,
         "ours_tokens_per_s": batch * new_tokens / ours_s, "step_bytes": step_bytes,
         "bandwidth_fraction": step_bytes * new_tokens / ours_s / bandwidth, "decode_pad_rows": pad}
  if pad:
    row.update(unpadded_s=unpadded_s, padded_row_speedup=unpadded_s / ours_s)
  del model
  gc.collect()
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg.to_hf()),
                                                     dtype=torch.bfloat16).to(dev).eval()
  ids_t = torch.tensor(ids, dtype=torch.long, device=dev)

  def theirs():
    with torch.inference_mode():
      hf.generate(ids_t, attention_mask=torch.ones_like(ids_t), do_sample=False, max_new_tokens=new_tokens,
                  min_new_tokens=new_tokens, pad_token_id=0)
    if dev == "cuda":
      torch.cuda.synchronize()

  row["transformers_s"] = _best(theirs, repeats)
  row["transformers_tokens_per_s"] = batch * new_tokens / row["transformers_s"]
  row["ratio"] = row["ours_tokens_per_s"] / row["transformers_tokens_per_s"]
  del hf
  gc.collect()
  if dev == "cuda":
    torch.cuda.empty_cache()
  return row


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--json", required=True, help="where to write the figures")
  parser.add_argument("--size", choices=sorted(SIZES), default="1b")
  parser.add_argument("--steps", type=int, default=5, help="timed train steps (best kept, after one warm-up)")
  parser.add_argument("--remat", default="none,dots_no_batch", help="model.remat policies to time, comma-separated")
  parser.add_argument("--attention", default=None, help="model.attention kernels to time, comma-separated "
                      "(default: xla, and cudnn on a GPU)")
  parser.add_argument("--skip", default="", help="comma-separated parts to skip: train,torch,attention,decode")
  args = parser.parse_args()
  spec, skip = SIZES[args.size], set(filter(None, args.skip.split(",")))
  dev = jax.devices()[0]
  out = {"device": dev.device_kind, "backend": jax.default_backend(), "platform": platform.platform(),
         "jax": jax.__version__, "size": args.size, "commit": os.environ.get("JAXAGENT_COMMIT")}
  out["limits"] = limits = device_limits(spec["matmul_n"], spec["bandwidth_gib"])
  print(f"{dev.device_kind}: bf16 matmul {limits['bf16_matmul_flops'] / 1e12:.1f} TFLOP/s measured "
        f"(nominal {(limits['nominal_bf16_flops'] or 0) / 1e12:.0f}), bandwidth "
        f"{limits['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s", flush=True)
  base = llama.DecoderConfig(**spec["cfg"])
  b, s = spec["train_batch"], spec["train_seq"]
  ids = np.random.RandomState(0).randint(0, base.vocab_size, (b, s + 1)).astype(np.int32)
  flops = mfu.decoder_flops_per_token(base, s) * b * s
  out["params"], out["train"] = base.num_params, {"batch": b, "seq": s, "flops_per_step": flops}

  def record(name, fn):
    try:
      t, loss = fn()
      out["train"][name] = {"step_s": t, "first_loss": loss, "tokens_per_s": b * s / t,
                            "mfu_vs_measured": flops / t / limits["bf16_matmul_flops"],
                            "mfu_vs_nominal": flops / t / limits["nominal_bf16_flops"]
                            if limits["nominal_bf16_flops"] else None}
      r = out["train"][name]
      print(f"train {name}: loss {loss:.4f}, {t * 1e3:.1f} ms/step, {r['tokens_per_s']:.0f} tok/s, MFU {r['mfu_vs_measured']:.1%} "
            f"of measured" + (f", {r['mfu_vs_nominal']:.1%} of nominal" if r["mfu_vs_nominal"] else ""), flush=True)
    except Exception:  # pylint: disable=broad-except
      out["train"][name] = {"error": traceback.format_exc()[-1500:]}
      print(f"train {name} failed:\n{out['train'][name]['error']}", flush=True)

  kernels = args.attention or ("xla,cudnn" if jax.default_backend() == "gpu" else "xla")
  # PyTorch first: it hands its memory back (`empty_cache`), while JAX's allocator keeps what it once held, which
  # left PyTorch out of memory on an 80 GB H100 when it ran second.
  if "torch" not in skip:
    record("torch_autocast_bf16", lambda: train_torch(base, ids, args.steps))
  if "train" not in skip:
    for kernel in kernels.split(","):
      for policy in filter(None, args.remat.split(",")):
        cfg = dataclasses.replace(base, dtype="bfloat16", param_dtype="float32", remat=policy, attention=kernel)
        record(f"ours_bf16_{kernel}_remat_{policy}", lambda cfg=cfg: train_ours(cfg, ids, args.steps))
  if "attention" not in skip:
    out["attention"] = attention(base, b, s, args.steps)
    if jax.default_backend() == "gpu":
      out["attention"]["cudnn_padded_parity"] = masked_parity("cudnn")
    print("attention fwd+bwd:", {k: (round(v * 1e3, 2) if k.endswith("_s") else v)
                                  for k, v in out["attention"].items()}, flush=True)
  if "decode" not in skip:
    out["decode"] = []
    for batch in (1, 8):
      try:
        r = decode(base, batch, spec["prompt_len"], spec["new_tokens"], 3, limits["bandwidth_bytes_per_s"])
        print(f"decode batch {batch}: ours {r['ours_tokens_per_s']:.0f} tok/s ({r['bandwidth_fraction']:.0%} of the "
              f"bandwidth), transformers {r['transformers_tokens_per_s']:.0f} tok/s, ratio {r['ratio']:.2f}x",
              flush=True)
      except Exception:  # pylint: disable=broad-except
        r = {"batch": batch, "error": traceback.format_exc()[-1500:]}
        print(f"decode batch {batch} failed:\n{r['error']}", flush=True)
      out["decode"].append(r)
  with open(args.json, "w") as f:
    json.dump(out, f, indent=2)
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
