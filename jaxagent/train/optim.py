"""Optimizer: AdamW on a warmup-cosine schedule with global-norm clipping (config block `optim`)."""

from __future__ import annotations

import jax
import optax


def lr_schedule(optim, total_steps: int) -> optax.Schedule:
  """Linear warmup to `optim.lr`, then cosine decay to `optim.lr * optim.end_lr_ratio` at `total_steps`."""
  warmup = max(0, min(int(optim.warmup_steps), total_steps - 1))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup else optim.lr, peak_value=optim.lr, warmup_steps=warmup,
      decay_steps=max(total_steps, warmup + 1), end_value=optim.lr * optim.end_lr_ratio)


def _decay_mask(params):
  """Weight decay on matrices only (not norms, biases or scalars), as is standard for transformers."""
  return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def make_optimizer(optim, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = lr_schedule(optim, total_steps)
  parts = []
  if optim.clip_norm and optim.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(optim.clip_norm))
  parts.append(optax.adamw(schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps,
                           weight_decay=optim.weight_decay, mask=_decay_mask))
  return optax.chain(*parts), schedule
