"""Digi-Q's critic: double Q and double V MLP heads over frozen (state, action) representations.

Transcribes `digiq/models/critic.py:VLMDoubleCritic` (`reference/algorithms.md` §5.3):

    v_states = [prev_type, prev_text, goal, image_features]                 (text features from encoders)
    q_states = v_states ‖ [act_type, act_text, q_rep]                         (q_rep: the VLM's (s, a) rep)
    Q_i: q_total → q_total → 5d → 5d → 5d → out      V_i: v_total → 3d → 3d → 3d → out      (ReLU, i = 1, 2)

with d the text-feature width (768 for RoBERTa-base), so that the paper-scale config reproduces
10752 → 10752 → 3840 → 3840 → 3840 and 5120 → 2304 → 2304 → 2304. `out` is 1 for regression
(`learn_metric: regression`, the code's default) and 2 for classification. V never sees the action.

Substitution (documented): the original runs three trainable RoBERTa-base encoders (goal, action type, typed
text). We run three trainable hashed-text encoders instead, so no download is needed and the critic trains on
a CPU (`CriticConfig.text_encoder`):
  * "pooler": a mean-pooled embedding bag over hashed word and character-trigram features followed by a
    dense + tanh pooler (RoBERTa's pooler shape); the paper-scale stand-in.
  * "bag_of_words": the hashed words' embeddings summed, no pooler: a linear map of the word counts, so the one
    word that tells two goals apart ("show the *lighting* category …") keeps its full weight. Measured on the
    CPU default's behaviour data, the pooler's average over ~80 word and trigram features left the critic at
    chance on the step that needs the goal (README, Digi-Q).
The text fields themselves are extracted exactly as the critic does (`critic_text_fields`): goal from
`Goal: (.*?)</s>`, the previous action from `Previous Actions: (.*?)Goal:`, action type and typed text from
the `"key": "value"` pairs, the raw string for both when the action does not parse.

Addition (off in the paper config): `CriticConfig.point_octaves > 0` appends Fourier features of the touch and
lift points of the previous action (to v_states) and of the candidate (to the action part of q_states). The
original critic sees where a tap lands only through the LLaVA representation of the screenshot with the cursor
drawn on it; a tiny VLM trained from scratch on a CPU encodes the tap position too weakly for that (its
within-state variation is ~5× smaller than across states), so the CPU default gives the critic the point
itself.

On top of the module: `td_loss` (the §5.4 critic loss with a target critic) and `best_of_n` (the §5.5
candidate re-ranking and actor weights), both wiring the pure functions of `jaxagent.rl.losses`.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
import zlib
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent.agents import autoui
from jaxagent.models import layers
from jaxagent.rl import losses

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


# ------------------------------------------------------------------------- text fields (host side)

_PREV_RE = re.compile(r"Previous Actions: (.*?)Goal:")
_GOAL_RE = re.compile(r"Goal: (.*?)</s>")


def action_points_parse(fields: Mapping[str, str | None]) -> bool:
  """`VLMDoubleCritic.is_action_valid`: touch and lift points `literal_eval` (weaker than the actor's check)."""
  try:
    ast.literal_eval(fields["touch_point"])
    ast.literal_eval(fields["lift_point"])
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def action_type_and_text(action: str) -> tuple[str, str]:
  """(action_type, typed_text) of an AutoUI action string; the raw string for both when it does not parse
  (`VLMDoubleCritic.parse_action_string`)."""
  fields = autoui.digiq_parse_action(action)
  if action_points_parse(fields):
    return fields["action_type"] or "", fields["typed_text"] or ""
  return action, action


def critic_text_fields(observation: str) -> tuple[str, str]:
  """(previous action, goal) of an AutoUI observation prompt (`VLMDoubleCritic.parse_obs`), "" when absent."""
  prev = _PREV_RE.search(observation)
  goal = _GOAL_RE.search(observation)
  return (prev.group(1) if prev else ""), (goal.group(1) if goal else "")


_WORD_RE = re.compile(r"\w+|[^\w\s]")


def hash_text(text: str, vocab: int, max_tokens: int, trigrams: bool = True) -> list[int]:
  """Hashed features of a text: its lower-cased words then (with `trigrams`) its character trigrams, ids in
  [1, vocab).

  Deterministic across processes (crc32, not Python's salted `hash`); truncated to the first `max_tokens`.
  """
  t = text.lower()
  feats = ["w" + w for w in _WORD_RE.findall(t)]
  if trigrams:
    feats += ["c" + t[i:i + 3] for i in range(max(len(t) - 2, 0))]
  return [1 + zlib.crc32(f.encode("utf-8")) % (vocab - 1) for f in feats[:max_tokens]]


def encode_texts(texts: Sequence[str], vocab: int, max_tokens: int, trigrams: bool = True) -> np.ndarray:
  """int32 [len(texts), max_tokens] of hashed feature ids, 0-padded."""
  out = np.zeros((len(texts), max_tokens), np.int32)
  for i, text in enumerate(texts):
    ids = hash_text(text, vocab, max_tokens, trigrams)
    out[i, :len(ids)] = ids
  return out


def action_point(action: str) -> np.ndarray:
  """float32 [5]: (touch x, touch y, lift x, lift y, 1) of a DUAL_POINT action (an AutoUI decision or the
  critic's previous-action field), zeros for any other action or one that does not parse."""
  fields = autoui.digiq_parse_action(action)
  if fields["action_type"] != "DUAL_POINT":
    return np.zeros(5, np.float32)
  try:
    touch, lift = ast.literal_eval(fields["touch_point"]), ast.literal_eval(fields["lift_point"])
    return np.asarray([*touch, *lift, 1.0], np.float32).reshape(5)
  except Exception:  # pylint: disable=broad-except
    return np.zeros(5, np.float32)


def fourier_points(points: jax.Array, octaves: int) -> jax.Array:
  """[..., 5] points (`action_point`) → [..., 8·octaves + 1]: sin and cos of 2^k·π·coordinate for k < octaves,
  zeroed where the flag is 0, then the flag."""
  points = jnp.asarray(points, jnp.float32)
  coords, flag = points[..., :4], points[..., 4:]
  freqs = (2.0 ** jnp.arange(octaves)) * jnp.pi
  angles = (coords[..., :, None] * freqs).reshape(coords.shape[:-1] + (4 * octaves,))
  return jnp.concatenate([jnp.sin(angles) * flag, jnp.cos(angles) * flag, flag], axis=-1)


def featurize(observations: Sequence[str], actions: Sequence[str] | Sequence[Sequence[str]],
              cfg: CriticConfig) -> dict[str, np.ndarray]:
  """The critic's text inputs for a batch: goal, prev_type, prev_text [B, L] and act_type, act_text [B, L]
  (one action per state) or [B, N, L] (N candidate actions per state). Image features and `q_rep` are
  added by the caller under `image_features` [B, image_dim] and `q_rep` [B, (N,) rep_dim]."""
  if len(observations) != len(actions):
    raise ValueError(f"featurize: {len(observations)} observations but {len(actions)} actions")
  trigrams = cfg.text_encoder == "pooler"
  enc = lambda xs: encode_texts(xs, cfg.text_vocab, cfg.max_text_tokens, trigrams)
  points = lambda xs: np.stack([action_point(a) for a in xs]) if xs else np.zeros((0, 5), np.float32)
  prevs, goals = zip(*(critic_text_fields(o) for o in observations)) if observations else ((), ())
  prev_type, prev_text = zip(*(action_type_and_text(p) for p in prevs)) if prevs else ((), ())
  batch = {"goal": enc(goals), "prev_type": enc(prev_type), "prev_text": enc(prev_text)}
  if cfg.point_octaves:
    batch["prev_point"] = points(prevs)
  if actions and not isinstance(actions[0], str):
    n = {len(a) for a in actions}
    if len(n) != 1:
      raise ValueError(f"featurize: every state needs the same number of candidate actions, got {sorted(n)}")
    flat = [a for cands in actions for a in cands]
    types, texts = zip(*(action_type_and_text(a) for a in flat))
    per_state = (len(actions), n.pop())
    batch["act_type"] = enc(types).reshape(per_state + (cfg.max_text_tokens,))
    batch["act_text"] = enc(texts).reshape(per_state + (cfg.max_text_tokens,))
    if cfg.point_octaves:
      batch["act_point"] = points(flat).reshape(per_state + (5,))
  else:
    types, texts = zip(*(action_type_and_text(a) for a in actions)) if actions else ((), ())
    batch["act_type"] = enc(types)
    batch["act_text"] = enc(texts)
    if cfg.point_octaves:
      batch["act_point"] = points(list(actions))
  return batch


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

  def scores(self, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Per-head scalar values (q [B, (N,) 2], v [B, 2]): the raw output for regression, softmax[1] for
    classification (§5.5) — the inputs of `losses.best_of_n_select`."""
    q1, q2, v1, v2 = self(batch)
    hv = lambda x: losses.head_value(x, self.learn_metric)
    return jnp.stack([hv(q1), hv(q2)], -1), jnp.stack([hv(v1), hv(v2)], -1)


# ------------------------------------------------------------------------------ losses on the critic


def td_loss(critic: DigiQCritic, target: DigiQCritic, batch: Mapping[str, jax.Array],
            next_state: Mapping[str, jax.Array], reward: jax.Array, done: jax.Array, gamma: float = 0.95,
            backup: str = "dataset", key: jax.Array | None = None, mc_return: jax.Array | None = None,
            advantage_estimation: str = "bellman") -> tuple[jax.Array, dict[str, jax.Array]]:
  """Digi-Q's critic loss on one batch (§5.4, `digiq/algorithms/digiq/trainer.py:critic_loss`).

  bellman: Q_i(s, a) → r + (1 − done) γ V̄_i(s'),  V_i(s) → Q̄_i(s, a_b)  with the target critic `target`;
  a_b is the dataset action (`backup="dataset"`, the code's default) or, for the paper's J_V, a π_β candidate
  (`"sample"`, one index per batch, needs `key`) or their mean (`"mean"`); those need the candidates in
  `batch` as `cand_type`, `cand_text` [B, N, L] and `cand_rep` [B, N, rep_dim] (and `cand_point` [B, N, 5] with
  `point_octaves`).
  mc: all four heads regress on G_t (or 1[G_t > 0] for classification), no target network.
  `next_state` holds s' (goal, prev_type, prev_text, image_features). Returns (loss, per-head losses).
  """
  metric = critic.learn_metric
  q1, q2, v1, v2 = critic(batch)
  if advantage_estimation == "mc":
    if mc_return is None:
      raise ValueError("td_loss(advantage_estimation='mc') needs `mc_return`")
    y = losses.digiq_mc_targets(mc_return, metric)
    return losses.digiq_critic_loss(q1, q2, v1, v2, (y, y), (y, y), metric)
  if advantage_estimation != "bellman":
    raise ValueError(f"advantage_estimation={advantage_estimation!r}: use 'bellman' or 'mc'")
  hv = lambda x: losses.head_value(x, metric)
  t_state = target.state_features(batch)
  if backup == "dataset":
    tq1, tq2 = (hv(x) for x in target.q_values(t_state, batch["act_type"], batch["act_text"], batch["q_rep"],
                                                 batch.get("act_point")))
  else:
    if "cand_rep" not in batch:
      raise ValueError(f"td_loss(backup={backup!r}) needs the candidates: batch['cand_type'], "
                       "batch['cand_text'] [B, N, L] and batch['cand_rep'] [B, N, rep_dim]")
    cq1, cq2 = target.q_values(t_state, batch["cand_type"], batch["cand_text"], batch["cand_rep"],
                               batch.get("cand_point"))
    tq1, tq2 = (losses.digiq_backup_qbar(hv(x), backup, key) for x in (cq1, cq2))
  tv1, tv2 = (hv(x) for x in target.values(target.state_features(next_state)))
  y_q, y_v = losses.digiq_td_targets(reward, done, gamma, tq1, tq2, tv1, tv2)
  return losses.digiq_critic_loss(q1, q2, v1, v2, y_q, y_v, metric)


def best_of_n(critic: DigiQCritic, batch: Mapping[str, jax.Array], valid: jax.Array, kind: str = "best-of-n",
              threshold: float = 0.10, pg_multiplier: float = 5.0, awr_beta: float = 0.01,
              head_reduce: str = "max", include_index0: bool = True) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Best-of-N policy extraction's critic side (§5.5): scores the N candidates of `batch` (act_* and q_rep with
  an N axis, index 0 = dataset action), returns (k* [B], Adv_k* [B], actor weight [B]). The actor loss is then
  `losses.bc_nll(logp_tok(a_k*), mask, weight, clamp_prob=losses.AUTOUI_PROB_CLAMP)`."""
  q, v = critic.scores(batch)
  idx, adv = losses.best_of_n_select(q, v, valid, head_reduce, include_index0)
  weight = losses.best_of_n_weights(adv, kind, threshold, pg_multiplier, awr_beta)
  return idx, jax.lax.stop_gradient(adv), weight
