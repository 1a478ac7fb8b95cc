"""Digi-Q's critic: double Q and double V MLP heads over frozen (state, action) representations.

Transcribes `digiq/models/critic.py:VLMDoubleCritic` (`reference/algorithms.md` §5.3):

    v_states = [prev_type, prev_text, goal, image_features]                 (text features from encoders)
    q_states = v_states ‖ [act_type, act_text, q_rep]                         (q_rep: the VLM's (s, a) rep)
    Q_i: q_total → q_total → 5d → 5d → 5d → out      V_i: v_total → 3d → 3d → 3d → out      (ReLU, i = 1, 2)

with d the text-feature width (768 for RoBERTa-base), so that the paper-scale config reproduces
10752 → 10752 → 3840 → 3840 → 3840 and 5120 → 2304 → 2304 → 2304. `out` is 1 for regression
(`learn_metric: regression`, the code's default) and 2 for classification. V never sees the action.

Substitutions (documented): three trainable hashed-text encoders instead of the original's RoBERTa-base ones
(no download; `CriticConfig.text_encoder`): "pooler", a mean-pooled embedding bag over hashed word and
character-trigram features, then dense + tanh (RoBERTa's pooler shape), the paper-scale stand-in; and
"bag_of_words", the hashed words' embeddings summed, a linear map of the word counts, so the one word that tells
two goals apart keeps its full weight (docs/results/digiq.md#critic-features). `CriticConfig.point_octaves > 0` (off
in the paper config) appends Fourier features of the previous action's and the candidate's touch and lift
points, which the original critic sees only through LLaVA's view of a cursor drawn on the screenshot
(docs/results/digiq.md#critic-features). The inputs come from `proj.digiq.features`; the losses and the training
live with the recipe (`proj.digiq.critic`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent.models import layers

# ------------------------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class CriticConfig:
  """Sizes of the critic. Hidden widths `None` follow the original's rule from `text_dim` (see module doc)."""

  text_vocab: int = 4096  # hashed feature buckets per text encoder (id 0 = padding)
  text_dim: int = 32  # d; RoBERTa-base pooler: 768
  max_text_tokens: int = 64  # hashed features kept per text
  image_dim: int = 64  # BLIP-2 1408 × 2 frame-stacked = 2816 in the seed data
  rep_dim: int = 64  # LLaVA-1.5-7B mean last-layer hidden state = 4096
  q_hidden: tuple[int, ...] | None = (128, 64)
  v_hidden: tuple[int, ...] | None = (64, 64)
  out_dim: int = 1  # 1: regression, 2: classification
  text_encoder: str = "pooler"  # pooler | bag_of_words (see module doc)
  point_octaves: int = 0  # Fourier octaves of the actions' touch/lift points; 0 = off (the paper)

  def __post_init__(self):
    if self.out_dim not in (1, 2):
      raise ValueError(f"CriticConfig.out_dim={self.out_dim}: use 1 (regression) or 2 (classification)")
    if self.text_encoder not in TEXT_ENCODERS:
      raise ValueError(f"CriticConfig.text_encoder={self.text_encoder!r}: use one of {TEXT_ENCODERS}")
    if self.point_octaves < 0:
      raise ValueError(f"CriticConfig.point_octaves={self.point_octaves} must be >= 0 (0 = no point features)")
    for name in ("text_vocab", "text_dim", "max_text_tokens", "image_dim", "rep_dim"):
      if getattr(self, name) < 1:
        raise ValueError(f"CriticConfig.{name}={getattr(self, name)} must be positive")

  @property
  def point_dim(self) -> int:
    """Width of one action's point features (0 when off): sin and cos of 4 coordinates per octave + a flag."""
    return 8 * self.point_octaves + 1 if self.point_octaves else 0

  @property
  def v_in(self) -> int:
    return 3 * self.text_dim + self.image_dim + self.point_dim

  @property
  def q_in(self) -> int:
    return 5 * self.text_dim + self.image_dim + self.rep_dim + 2 * self.point_dim

  @property
  def q_widths(self) -> tuple[int, ...]:
    if self.q_hidden is not None:
      return tuple(self.q_hidden)
    return (self.q_in,) + (5 * self.text_dim,) * 3

  @property
  def v_widths(self) -> tuple[int, ...]:
    if self.v_hidden is not None:
      return tuple(self.v_hidden)
    return (3 * self.text_dim,) * 3

  @classmethod
  def paper(cls, learn_metric: str = "regression") -> "CriticConfig":
    """Digi-Q's sizes (§5.3): 768-d text features, 2816-d image features, 4096-d LLaVA representations."""
    return cls(text_vocab=50265, text_dim=768, max_text_tokens=512, image_dim=2816, rep_dim=4096,
               q_hidden=None, v_hidden=None, out_dim=_out_dim(learn_metric))

  @classmethod
  def tiny(cls, image_dim: int = 64, rep_dim: int = 64, learn_metric: str = "regression", **kw) -> "CriticConfig":
    """A CPU-sized critic for the embedded default and tests."""
    return cls(image_dim=image_dim, rep_dim=rep_dim, out_dim=_out_dim(learn_metric), **kw)


TEXT_ENCODERS = ("pooler", "bag_of_words")


def _out_dim(learn_metric: str) -> int:
  if learn_metric not in ("regression", "classification"):
    raise ValueError(f"learn_metric={learn_metric!r}: use 'regression' or 'classification'")
  return 1 if learn_metric == "regression" else 2


def fourier_points(points: jax.Array, octaves: int) -> jax.Array:
  """[..., 5] points (`action_point`) → [..., 8·octaves + 1]: sin and cos of 2^k·π·coordinate for k < octaves,
  zeroed where the flag is 0, then the flag."""
  points = jnp.asarray(points, jnp.float32)
  coords, flag = points[..., :4], points[..., 4:]
  freqs = (2.0 ** jnp.arange(octaves)) * jnp.pi
  angles = (coords[..., :, None] * freqs).reshape(coords.shape[:-1] + (4 * octaves,))
  return jnp.concatenate([jnp.sin(angles) * flag, jnp.cos(angles) * flag, flag], axis=-1)


# ------------------------------------------------------------------------------------------ modules


def _point_features(points: jax.Array | None, octaves: int, name: str) -> jax.Array:
  """`fourier_points` of a batch field that `point_octaves > 0` requires; the error names the missing field."""
  if points is None:
    raise ValueError(f"DigiQCritic: CriticConfig.point_octaves > 0 needs batch[{name!r}] (from `featurize` with "
                     "the same config)")
  return fourier_points(points, octaves)


def _torch_default_std(fan_in: int) -> float:
  """std of torch.nn.Linear's default U(−1/√fan_in, 1/√fan_in) init, which the original heads use."""
  return 1.0 / math.sqrt(3.0 * fan_in)


class HashedTextEncoder(nnx.Module):
  """Mean-pooled embedding bag over hashed text features → dense → tanh: our stand-in for a RoBERTa pooler."""

  def __init__(self, vocab: int, dim: int, *, rngs: nnx.Rngs):
    self.embed = layers.Embed(vocab, dim, rngs=rngs)
    self.pool = layers.Dense(dim, dim, in_axes=("embed",), out_axes=("mlp",), use_bias=True,
                             init_std=_torch_default_std(dim), rngs=rngs)

  def __call__(self, ids: jax.Array) -> jax.Array:
    m = (ids > 0).astype(jnp.float32)[..., None]
    bag = jnp.sum(self.embed(ids) * m, axis=-2) / jnp.maximum(jnp.sum(m, axis=-2), 1.0)
    return jnp.tanh(self.pool(bag))


class BagOfWordsEncoder(nnx.Module):
  """Summed embeddings of hashed words, no pooler: a linear map of the word counts (see module doc)."""

  def __init__(self, vocab: int, dim: int, *, rngs: nnx.Rngs):
    # One word alone reaches the heads at the scale of the other inputs (std 0.3 per dimension), not 0.02.
    self.embed = layers.Embed(vocab, dim, init_std=0.3, rngs=rngs)

  def __call__(self, ids: jax.Array) -> jax.Array:
    return jnp.sum(self.embed(ids) * (ids > 0).astype(jnp.float32)[..., None], axis=-2)


class MLPHead(nnx.Module):
  """Linear → ReLU → … → Linear(out): one of the critic's heads."""

  def __init__(self, in_dim: int, widths: Sequence[int], out_dim: int, *, rngs: nnx.Rngs):
    dims = (in_dim,) + tuple(widths)
    axes = ("embed", "mlp")
    self.hidden = nnx.List([
        layers.Dense(dims[i], dims[i + 1], in_axes=(axes[i % 2],), out_axes=(axes[(i + 1) % 2],),
                     use_bias=True, init_std=_torch_default_std(dims[i]), rngs=rngs)
        for i in range(len(widths))])
    self.out = layers.Dense(dims[-1], out_dim, in_axes=(axes[len(widths) % 2],), out_axes=("value_out",),
                            use_bias=True, init_std=_torch_default_std(dims[-1]), rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    for layer in self.hidden:
      x = jax.nn.relu(layer(x))
    return self.out(x)


class DigiQCritic(nnx.Module):
  """Double Q over q_states and double V over v_states (§5.3). Inputs are a mapping of arrays:

  goal, prev_type, prev_text [B, L] int32 (see `featurize`), image_features [B, image_dim];
  act_type, act_text [B, (N,) L] and q_rep [B, (N,) rep_dim] for Q (N candidate actions per state optional);
  with `point_octaves`, also prev_point [B, 5] and act_point [B, (N,) 5] (`action_point`).
  """

  def __init__(self, cfg: CriticConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    encoder = HashedTextEncoder if cfg.text_encoder == "pooler" else BagOfWordsEncoder
    self.task_encoder = encoder(cfg.text_vocab, cfg.text_dim, rngs=rngs)
    self.type_encoder = encoder(cfg.text_vocab, cfg.text_dim, rngs=rngs)
    self.text_encoder = encoder(cfg.text_vocab, cfg.text_dim, rngs=rngs)
    self.q1 = MLPHead(cfg.q_in, cfg.q_widths, cfg.out_dim, rngs=rngs)
    self.q2 = MLPHead(cfg.q_in, cfg.q_widths, cfg.out_dim, rngs=rngs)
    self.v1 = MLPHead(cfg.v_in, cfg.v_widths, cfg.out_dim, rngs=rngs)
    self.v2 = MLPHead(cfg.v_in, cfg.v_widths, cfg.out_dim, rngs=rngs)

  def state_features(self, batch: Mapping[str, jax.Array]) -> jax.Array:
    """v_states = [prev_type, prev_text, goal, image_features]  [B, v_in]."""
    image = jnp.asarray(batch["image_features"], jnp.float32)
    if image.shape[-1] != self.cfg.image_dim:
      raise ValueError(f"DigiQCritic: image_features has width {image.shape[-1]} but "
                       f"CriticConfig.image_dim={self.cfg.image_dim}; set image_dim to the feature width")
    parts = [self.type_encoder(batch["prev_type"]), self.text_encoder(batch["prev_text"])]
    if self.cfg.point_octaves:
      parts.append(_point_features(batch.get("prev_point"), self.cfg.point_octaves, "prev_point"))
    return jnp.concatenate(parts + [self.task_encoder(batch["goal"]), image], axis=-1)

  def values(self, v_states: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(V1, V2) [B, out]."""
    return self.v1(v_states), self.v2(v_states)

  def q_values(self, v_states: jax.Array, act_type: jax.Array, act_text: jax.Array, q_rep: jax.Array,
               act_point: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(Q1, Q2) [B, (N,) out] of q_states = v_states ‖ [act_type, act_text, (act_point,) q_rep]."""
    q_rep = jnp.asarray(q_rep, jnp.float32)
    if q_rep.shape[-1] != self.cfg.rep_dim:
      raise ValueError(f"DigiQCritic: q_rep has width {q_rep.shape[-1]} but CriticConfig.rep_dim="
                       f"{self.cfg.rep_dim}; set rep_dim to the representation width")
    parts = [self.type_encoder(act_type), self.text_encoder(act_text)]
    if self.cfg.point_octaves:
      parts.append(_point_features(act_point, self.cfg.point_octaves, "act_point"))
    act = jnp.concatenate(parts + [q_rep], axis=-1)
    extra = act.ndim - v_states.ndim  # 1 when candidates carry an N axis
    s = v_states.reshape(v_states.shape[:1] + (1,) * extra + v_states.shape[1:])
    s = jnp.broadcast_to(s, act.shape[:-1] + v_states.shape[-1:])
    q_states = jnp.concatenate([s, act], axis=-1)
    return self.q1(q_states), self.q2(q_states)

  def __call__(self, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(Q1, Q2, V1, V2), as `VLMDoubleCritic.forward` returns them."""
    v_states = self.state_features(batch)
    q1, q2 = self.q_values(v_states, batch["act_type"], batch["act_text"], batch["q_rep"], batch.get("act_point"))
    v1, v2 = self.values(v_states)
    return q1, q2, v1, v2

  @property
  def learn_metric(self) -> str:
    return "regression" if self.cfg.out_dim == 1 else "classification"
