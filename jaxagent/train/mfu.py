"""Model FLOPs utilisation: analytic model FLOPs per step / step time / peak FLOP/s.

FLOPs follow maxtext's `calculate_tflops_training_per_device` (`reference/jax_stack.md` §3.1): 6 FLOPs per
matmul weight per token for forward + backward, plus causal attention 6·S·(heads·head_dim) per token per layer
(QKᵀ and AV, halved for the causal mask). Embedding lookups are not matmuls and are not counted; a tied
output projection is. Peak is the device's known dense bf16 rate, or, where none is known (CPU), the matmul rate
measured on this machine by `measured_matmul_flops()` — so CPU MFU says how close the step gets to the best
matmul this machine does.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

# Dense bf16 peaks per device (jax_stack.md §3.1).
KNOWN_PEAKS = {
    "H100": 989e12, "H200": 989e12, "A100": 312e12,
    "TPU v5p": 459e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12,
}


def transformer_flops_per_token(matmul_params: int, num_layers: int, attn_dim: int, seq_len: int,
                                training: bool = True) -> float:
  """FLOPs per token of one forward (+ backward if `training`) pass of a causal decoder."""
  mult = 3 if training else 1
  return mult * (2.0 * matmul_params + 2.0 * num_layers * seq_len * attn_dim)


def device_peak_flops(device: jax.Device | None = None) -> float | None:
  kind = (device or jax.devices()[0]).device_kind
  for name, peak in KNOWN_PEAKS.items():
    if name.lower() in kind.lower():
      return peak
  return None


@functools.lru_cache(maxsize=None)
def measured_matmul_flops(n: int = 1024, dtype: str = "float32", repeats: int = 5) -> float:
  """FLOP/s of a jitted n×n×n matmul on one device of this machine (best of `repeats`; cached per process)."""
  dev = jax.devices()[0]
  a = jax.device_put(jnp.ones((n, n), dtype), dev)
  b = jax.device_put(jnp.ones((n, n), dtype), dev)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2.0 * n**3 / best


def peak_flops(configured: float = 0.0) -> tuple[float, str]:
  """(peak FLOP/s for the whole job, where it came from): the config's value, a known device, or measured.

  The measured rate is per device; on CPU the simulated devices share the host's cores, so the job's peak is
  the one host rate, not rate × device count.
  """
  n_dev = jax.device_count()
  if configured and configured > 0:
    return float(configured) * n_dev, "config"
  known = device_peak_flops()
  if known is not None:
    return known * n_dev, "device"
  return measured_matmul_flops(), "measured_matmul"


def mfu(flops_per_step: float, step_time_s: float, peak: float) -> float:
  return flops_per_step / max(step_time_s, 1e-12) / peak


def decoder_flops_per_token(cfg, seq_len: int, training: bool = True) -> float:
  """`transformer_flops_per_token` for a `models.llama.DecoderConfig`."""
  norms = cfg.hidden_size * (2 * cfg.num_layers + 1)
  lookup = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size  # the input table is not a matmul
  return transformer_flops_per_token(cfg.num_params - norms - lookup, cfg.num_layers,
                                     cfg.num_heads * cfg.head_dim, seq_len, training)


def vit_flops_per_image(cfg, training: bool = True) -> float:
  """Forward (+ backward) FLOPs of a `models.vit.ViTConfig` tower on one image (full, non-causal attention)."""
  tokens = cfg.grid**2 + (1 if cfg.class_token else 0)
  w = cfg.width
  per_block = 4 * w * w + 2 * w * cfg.mlp_dim
  matmul = cfg.depth * per_block + 3 * cfg.patch_size**2 * w
  attention = cfg.depth * 2 * tokens * w  # per token: QKᵀ and AV over all `tokens` keys
  return (3 if training else 1) * tokens * (2.0 * matmul + 2.0 * attention)
