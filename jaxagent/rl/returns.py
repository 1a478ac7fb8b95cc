"""Discounted Monte-Carlo returns, shared by the rollout collector and the RL losses.

`G_t = sum_{k >= t} gamma^(k - t) r_k`, DigiRL's `env_utils.add_mc_return` (matrix form) and WebRL's loader
(`reference/algorithms.md` §4.6, §3.5). Written as a reverse scan over the last axis so it takes numpy or jax
arrays, single trajectories `[T]` or padded batches `[B, T]` (pad rewards with 0 beyond each episode's end).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def mc_return(rewards: Any, gamma: float) -> Any:
  """Discounted reward-to-go along the last axis; numpy in -> numpy out, jax in -> jax out (jit-safe)."""
  if not 0.0 <= gamma <= 1.0:
    raise ValueError(f"mc_return: gamma={gamma} must lie in [0, 1]")
  if type(rewards).__module__.startswith("jax"):
    return _mc_return_jax(rewards, gamma)
  r = np.asarray(rewards, dtype=np.float32)
  out = np.zeros_like(r)
  running = np.zeros(r.shape[:-1], np.float32)
  for t in range(r.shape[-1] - 1, -1, -1):
    running = r[..., t] + np.float32(gamma) * running
    out[..., t] = running
  return out


def _mc_return_jax(rewards, gamma):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  r = jnp.moveaxis(jnp.asarray(rewards, jnp.float32), -1, 0)

  def back(running, r_t):
    running = r_t + gamma * running
    return running, running

  _, out = jax.lax.scan(back, jnp.zeros(r.shape[1:], r.dtype), r, reverse=True)
  return jnp.moveaxis(out, 0, -1)
