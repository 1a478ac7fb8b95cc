"""Critic and reward-model heads on a decoder's hidden states.

Two poolings cover the published critics (`reference/algorithms.md`):
- `last_token(hidden, mask)`: the hidden state of each row's last real token — WebRL's critic reads
  `h[:, -1]` with right padding (§3.7); we find the last real token, so either padding side works.
- `masked_mean(hidden, mask)`: the mean over a mask, e.g. the generated tokens — Digi-Q's (s, a)
  representation is the mean of last-layer hidden states over generated tokens (§5.2).

`ValueHead` is pooling + an MLP with ReLU and a scalar (out_dim=1, squeezed) or two-way (out_dim=2, logits;
WebRL's V(s) = softmax(head(h))[1]) output. `hidden` is the decoder's final-norm output
(`Decoder(..., return_hidden=True)`).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent.models import layers

POOLINGS = ("last", "mean")


def last_token_index(mask: jax.Array) -> jax.Array:
  """Index [B] of each row's last True in mask [B, T] (0 for an all-False row)."""
  t = mask.shape[1]
  return jnp.where(jnp.any(mask, axis=1), t - 1 - jnp.argmax(mask[:, ::-1], axis=1), 0).astype(jnp.int32)


def select_token(hidden: jax.Array, index: jax.Array) -> jax.Array:
  """hidden [B, T, E] at index [B] -> [B, E]."""
  return jnp.take_along_axis(hidden, index[:, None, None].astype(jnp.int32), axis=1)[:, 0]


def last_token(hidden: jax.Array, mask: jax.Array) -> jax.Array:
  return select_token(hidden, last_token_index(mask.astype(bool)))


def masked_mean(hidden: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of hidden [B, T, E] over mask [B, T], in float32; an all-False row gives zeros."""
  m = mask.astype(jnp.float32)[..., None]
  total = jnp.sum(hidden.astype(jnp.float32) * m, axis=1)
  return total / jnp.maximum(jnp.sum(m, axis=1), 1.0)


def pool(hidden: jax.Array, mask: jax.Array, pooling: str) -> jax.Array:
  if pooling == "last":
    return last_token(hidden, mask)
  if pooling == "mean":
    return masked_mean(hidden, mask)
  raise ValueError(f"pooling={pooling!r}; use one of {POOLINGS}")


class MLP(nnx.Module):
  """Dense → ReLU → … → Dense(out_dim), biases zero-initialised, weights N(0, init_std)."""

  def __init__(self, in_dim: int, widths: Sequence[int], out_dim: int, *, init_std: float = 0.02,
               dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
    dims = (in_dim,) + tuple(widths)
    axes = ("embed", "mlp")  # alternate so that consecutive layers shard on opposite sides
    self.hidden = nnx.List([
        layers.Dense(dims[i], dims[i + 1], in_axes=(axes[i % 2],), out_axes=(axes[(i + 1) % 2],),
                     use_bias=True, init_std=init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        for i in range(len(widths))])
    self.out = layers.Dense(dims[-1], out_dim, in_axes=(axes[len(widths) % 2],), out_axes=("value_out",),
                            use_bias=True, init_std=init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    for layer in self.hidden:
      x = jax.nn.relu(layer(x))
    return self.out(x)


class ValueHead(nnx.Module):
  """Pool hidden states, then an MLP: scalar values [B] (out_dim=1) or two-way logits [B, 2] (out_dim=2).

  WebRL's critic head is `ValueHead(d, widths=(d, d), out_dim=2, pooling="last", init_std=0.2)`
  (MLP d→d→d→2 with ReLU, §3.7).
  """

  def __init__(self, in_dim: int, *, widths: Sequence[int] = (), out_dim: int = 1, pooling: str = "last",
               init_std: float = 0.02, dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
    if out_dim not in (1, 2):
      raise ValueError(f"ValueHead out_dim={out_dim}: use 1 (scalar) or 2 (two-way logits)")
    if pooling not in POOLINGS:
      raise ValueError(f"ValueHead pooling={pooling!r}; use one of {POOLINGS}")
    self.pooling = pooling
    self.out_dim = out_dim
    self.mlp = MLP(in_dim, widths, out_dim, init_std=init_std, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def from_features(self, features: jax.Array) -> jax.Array:
    """Head on already pooled features [B, E]."""
    out = self.mlp(features).astype(jnp.float32)
    return out[..., 0] if self.out_dim == 1 else out

  def __call__(self, hidden: jax.Array, mask: jax.Array) -> jax.Array:
    return self.from_features(pool(hidden, mask, self.pooling))
