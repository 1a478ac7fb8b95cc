"""Low-rank adapters (LoRA) on a built model's linears: Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
Language Models", arXiv:2106.09685.

A targeted `layers.Dense` becomes a `LoRADense`: the same frozen `kernel` (and `bias`) under the same names, so
the HF mapping tables and checkpoints of the base model still read it, plus `lora_a [*in, r]` (Gaussian) and
`lora_b [r, *out]` (zeros, so a fresh adapter changes no output) adding `(alpha / r) · x A B`. Both adapters are
`LoRAParam`s: `wrt=LoRAParam` trains them alone. `merge(model)` folds them into the kernels and gives back the
base structure, what an export writes.

A target is a linear's attribute name inside the module class that owns it (`TARGETS`), so `q_proj` means the
language decoder's attention projection and not idefics2's perceiver one.
"""

from __future__ import annotations

import math
from typing import Iterable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent.models import layers, llama, vit, vlm


class LoRAParam(nnx.Param):
  """An adapter matrix: an `nnx.Param` (so `nnx.Param` filters still see it) that a filter can pick alone."""


# target name -> the module class whose attribute it is
TARGETS: dict[str, type] = {
    **{name: llama.Attention for name in ("q_proj", "k_proj", "v_proj", "o_proj")},
    **{name: llama.MLP for name in ("gate_proj", "up_proj", "down_proj")},
    **{name: vlm.Projector for name in ("linear_1", "linear_2")},  # LLaVA's projector
    **{name: vit.Attention for name in ("q", "k", "v", "out")},  # the ViT vision tower
    **{name: vit.Mlp for name in ("fc1", "fc2")},
}
# the language decoder's attention and MLP projections (`models.LORA_TARGETS` / `DEFAULT_LORA_TARGETS` repeat
# these names for config checks that import no JAX)
DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


class LoRADense(layers.Dense):
  """`layers.Dense` plus `(alpha / rank) · (x A) B`; built around an existing Dense, sharing its variables."""

  def __init__(self, base: layers.Dense, rank: int, alpha: float, *, rngs: nnx.Rngs):
    self.in_shape, self.out_shape, self.dtype = base.in_shape, base.out_shape, base.dtype
    self.kernel, self.bias = base.kernel, base.bias
    self.rank, self.alpha = int(rank), float(alpha)
    axes = tuple(base.kernel.get_metadata().get("logical_axes") or (None,) * base.kernel.ndim)
    n_in, dtype = len(self.in_shape), base.kernel.dtype
    # Gaussian A as the paper; std 1/sqrt(fan_in) keeps x A at the scale of x.
    std = 1.0 / math.sqrt(math.prod(self.in_shape))
    self.lora_a = LoRAParam(layers.normal_init(std)(rngs.params(), self.in_shape + (self.rank,), dtype),
                            logical_axes=axes[:n_in] + (None,))
    self.lora_b = LoRAParam(jnp.zeros((self.rank,) + self.out_shape, dtype), logical_axes=(None,) + axes[n_in:])

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  def __call__(self, x: jax.Array) -> jax.Array:
    y = super().__call__(x)
    n_in = len(self.in_shape)
    lead = x.shape[:x.ndim - n_in]
    a = self.lora_a.get_value().astype(self.dtype).reshape(-1, self.rank)
    b = self.lora_b.get_value().astype(self.dtype).reshape(self.rank, -1)
    delta = layers.matmul(layers.matmul(x.astype(self.dtype).reshape(-1, a.shape[0]), a), b)
    return y + (self.scale * delta).astype(y.dtype).reshape(*lead, *self.out_shape)

  def merged_kernel(self) -> jax.Array:
    """W + (alpha / rank) · A B, computed in float32, in the kernel's dtype and shape."""
    kernel = self.kernel.get_value()
    a = self.lora_a.get_value().astype(jnp.float32).reshape(-1, self.rank)
    b = self.lora_b.get_value().astype(jnp.float32).reshape(self.rank, -1)
    return (kernel.astype(jnp.float32) + self.scale * (a @ b).reshape(kernel.shape)).astype(kernel.dtype)


def _targets(targets: str | Iterable[str]) -> tuple[str, ...]:
  names = [t.strip() for t in targets.split(",")] if isinstance(targets, str) else [str(t).strip() for t in targets]
  names = tuple(t for t in names if t)
  unknown = [t for t in names if t not in TARGETS]
  if unknown:
    raise ValueError(f"LoRA targets {unknown} are not linears LoRA knows; use names of {tuple(TARGETS)}")
  return names


def add_lora(model: nnx.Module, rank: int, alpha: float = 16.0, targets: str | Iterable[str] = DEFAULT_TARGETS,
             seed: int = 0) -> nnx.Module:
  """Puts fresh adapters on `model`'s targeted linears, in place (returns `model`); rank 0 adds none.

  `targets`: names of `TARGETS` (a comma-separated string or a sequence); default the language decoder's
  attention and MLP projections. A name that matches no linear of this model is a ValueError (a typo, or a
  projector target on a model without LLaVA's projector). Linears that already carry adapters keep them.
  """
  if rank == 0:
    return model
  if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
    raise ValueError(f"LoRA rank={rank!r}: must be a whole number >= 0")
  if not alpha > 0:
    raise ValueError(f"LoRA alpha={alpha!r}: must be > 0")
  names = _targets(targets)
  found = {name: [] for name in names}
  for _, node in nnx.iter_graph(model):
    for name in names:
      child = getattr(node, name, None) if isinstance(node, TARGETS[name]) else None
      if isinstance(child, layers.Dense) and not isinstance(child, LoRADense):
        found[name].append(node)
  missing = [name for name, owners in found.items() if not owners]
  if missing:
    raise ValueError(f"LoRA targets {missing} match no linear of this {type(model).__name__}; drop them from "
                     "config.model.lora.targets")
  rngs = nnx.Rngs(seed)
  for name, owners in found.items():
    for owner in owners:
      setattr(owner, name, LoRADense(getattr(owner, name), rank, alpha, rngs=rngs))
  return model


def has_lora(model: nnx.Module) -> bool:
  return any(isinstance(node, LoRADense) for _, node in nnx.iter_graph(model))


def merge(model: nnx.Module) -> nnx.Module:
  """A model of the base structure: each adapter folded into its kernel (W + (alpha/rank)·A·B), no `LoRAParam`
  left. `model` itself is left as it was (the result shares its other arrays); without adapters it is returned
  as is."""
  if not has_lora(model):
    return model
  model = nnx.merge(*nnx.split(model))  # new Variables and modules around the same arrays
  owners = [(node, name, child) for _, node in nnx.iter_graph(model) if isinstance(node, nnx.Module)
            for name, child in vars(node).items() if isinstance(child, LoRADense)]
  for owner, name, lora in owners:
    setattr(owner, name, _plain_dense(lora))
  return model


def _plain_dense(lora: LoRADense) -> layers.Dense:
  """The `layers.Dense` a LoRADense folds into, built without initialising a kernel it would throw away."""
  axes = tuple(lora.kernel.get_metadata().get("logical_axes") or (None,) * lora.kernel.ndim)
  n_in = len(lora.in_shape)
  dense = nnx.eval_shape(lambda: layers.Dense(
      lora.in_shape, lora.out_shape, in_axes=axes[:n_in], out_axes=axes[n_in:], use_bias=lora.bias is not None,
      dtype=lora.dtype, param_dtype=lora.kernel.dtype, rngs=nnx.Rngs(0)))
  dense.kernel = nnx.Param(lora.merged_kernel(), **lora.kernel.get_metadata())
  dense.bias = lora.bias
  return dense
