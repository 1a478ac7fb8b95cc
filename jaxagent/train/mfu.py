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
import platform
import time

import jax
import jax.numpy as jnp

# The FLOP counts live with the models; re-exported for callers of `mfu.*_flops_*`.
from jaxagent.models.flops import (  # noqa: F401
    decoder_flops_per_token, transformer_flops_per_token, vit_flops_per_image)

# Dense bf16 peaks per device (jax_stack.md §3.1).
KNOWN_PEAKS = {
    "H100": 989e12, "H200": 989e12, "A100": 312e12,
    "TPU v5p": 459e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12,
}


def device_peak_flops(device: jax.Device | None = None) -> float | None:
  kind = (device or jax.devices()[0]).device_kind
  for name, peak in KNOWN_PEAKS.items():
    if name.lower() in kind.lower():
      return peak
  return None


@functools.lru_cache(maxsize=None)
def measured_matmul_flops(n: int = 1024, dtype: str = "float32", repeats: int = 5) -> float:
  """FLOP/s of a jitted n×n×n matmul on one device of this machine (best of `repeats`; cached per process). A
  bfloat16 product writes float32 results, as the models' products do (`layers.product_type`): XLA:CPU runs a
  bfloat16-result product as a float32 one."""
  dev = jax.devices()[0]
  a = jax.device_put(jnp.ones((n, n), dtype), dev)
  b = jax.device_put(jnp.ones((n, n), dtype), dev)
  f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
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


def processor_name() -> str:
  """The CPU a figure was measured on, as results name it: "AMD EPYC (family 25, model 17)" (the 2-core machines
  change between sessions, and a ratio holds on one processor family)."""
  try:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
      info = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}
    return f"{info['model name']} (family {info['cpu family']}, model {info['model']})"
  except (OSError, KeyError):
    return platform.processor() or "unknown"
