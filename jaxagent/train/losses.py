"""Token-level losses shared by the supervised recipes."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def masked_cross_entropy(logits: jnp.ndarray, targets: jnp.ndarray, mask: jnp.ndarray):
  """Mean next-token cross-entropy over the tokens where `mask` is set.

  OpenWebVoyager's SFT loss (`reference/algorithms.md` §2.5): -Σ_t m_t log p(y_t | y_<t, images) / Σ_t m_t,
  with m_t = 1 on assistant-turn tokens only (image and user tokens never carry loss). `targets` are the inputs
  shifted left by one, so position t predicts token t+1. Computed in float32 whatever the logits' dtype.

  Returns (loss, number of loss tokens).
  """
  logp_loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  mask = mask.astype(jnp.float32)
  count = mask.sum()
  return (logp_loss * mask).sum() / jnp.maximum(count, 1.0), count
