"""Target networks: a second copy of the parameters that trails the online ones by Polyak averaging.

Digi-Q keeps a second critic of the same architecture, built with its own random initialisation
(`digiq/models/autoui_agent.py:AutoUIAgent.__init__`; `advantage_estimation: bellman`), and moves it toward the online
critic once per epoch with τ = 0.10 (`reference/algorithms.md` §5.3; `digiq/models/autoui_agent.py:
soft_update_target_critic`, called from `digiq/algorithms/digiq/trainer.py:update_critic`). Both functions
work on any pytree of arrays, including an `nnx.State` (whose Variables keep their metadata, e.g.
`logical_axes`, so the target shards like the online parameters).
"""

from __future__ import annotations

from typing import TypeVar

import jax
import jax.numpy as jnp
import optax
from flax import nnx

Tree = TypeVar("Tree")

DIGIQ_TAU = 0.10  # §5.3, §5.7


def polyak_update(target: Tree, online: Tree, tau: float) -> Tree:
  """θ̄ ← (1 − τ) θ̄ + τ θ, leaf by leaf (`optax.incremental_update(online, target, τ)`).

  τ = 1 copies the online parameters; τ = 0 leaves the target unchanged. Pure: returns the new target.
  """
  if isinstance(tau, (int, float)) and not 0.0 <= tau <= 1.0:  # a traced tau is the caller's to check
    raise ValueError(f"polyak_update: tau={tau} must lie in [0, 1] (Digi-Q uses {DIGIQ_TAU})")
  return optax.incremental_update(online, target, tau)


def init_target(online: Tree) -> Tree:
  """A target network that starts equal to the online one, in its own buffers (`critic.target_init=copy`; the
  original Digi-Q builds its target from a fresh random init instead)."""
  return jax.tree.map(jnp.array, online)


def soft_update(target: nnx.Module, online: nnx.Module, tau: float) -> None:
  """In place on NNX modules: the target's parameters ← polyak_update(target, online, τ)
  (`digiq/models/autoui_agent.py:soft_update_target_critic`). Works inside `nnx.jit`."""
  nnx.update(target, polyak_update(nnx.state(target, nnx.Param), nnx.state(online, nnx.Param), tau))
