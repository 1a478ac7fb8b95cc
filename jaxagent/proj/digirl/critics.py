"""DigiRL's two value functions, its step advantage and its trajectory filters (`reference/algorithms.md` §4.6–4.8).

  inputs        a trajectory's first observation text (`Previous Actions: Goal: {task}</s>`) for the instruction
                critic; each state's observation text and frame-stacked image features [f_{t−1} ‖ f_t]
                (f_{−1} := f_0, `offpolicy_train_loop.py:framestack`) for the step critic, s' = [f_t ‖ f_{t+1}]
  text          a hashed bag of words and word bigrams (`bag_of_words`), the CPU stand-in for RoBERTa-base's
                pooler output (768-d in the code); frozen for the step critic (the code forces `detach_model`),
                followed by a trainable tanh layer for the instruction critic (whose RoBERTa the code trains)
  image         the IL VLM's mean-pooled vision features of the 1/4 screen (`pipeline.device.screen_features`),
                the stand-in for BLIP-2's pooled ViT-g features (1408-d); none with a text observation
                (`env.observation=html`), whose prompt, the `text` input, already holds the page
  V^inst(c)     `TrajectoryCritic`: CE of 2 logits to y = 1[G_last > 0] (`trainer.py:trajectory_critic_loss`)
  V^step(s)     `StepCritic`: two heads MLP(in → h → h → 2), ReLU; CE of both heads at s AND at s' to the label
                of s, y = 1[G_t > 0] (`trainer.py:critic_loss`); V = min of the heads' softmax[1]
  advantage     A = V(s') − V(s) − 0.05 + r + G_t, weight 1[clamp(A, 0, 1) > 0] (`trainer.py:actor_loss`); the
                paper's doubly-robust A with the 1/H threshold as `actor.advantage=dr`
  filters       `filterbc_keep`: trajectory reward ≥ its 0.9-quantile (the offline phase and Filtered BC);
                `digirl_keep`: reward − clamp(V^inst, 1e-4, 1 − 1e-4) ≥ its 0.9-quantile (the online phase)
"""

from __future__ import annotations

import zlib
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import types
from jaxagent.data import pipeline, transitions
from jaxagent.pipeline.device import FORMAT
from jaxagent.rl import losses
from jaxagent.train import loop

ADVANTAGE_C = 0.05  # the code's constant in A (the paper's 1/H threshold)


# ---------------------------------------------------------------------------------------------- inputs


def bag_of_words(texts: Sequence[str], dim: int) -> np.ndarray:
  """[len(texts), dim] counts of each text's lower-cased words and word bigrams hashed (crc32) into `dim`
  buckets, scaled by 1/√(number of features): a fixed text featurisation, the same in every process."""
  out = np.zeros((len(texts), dim), np.float32)
  for row, text in enumerate(texts):
    words = text.replace("</s>", " ").lower().split()
    feats = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
    for f in feats:
      out[row, zlib.crc32(f.encode()) % dim] += 1.0
    out[row] /= max(1.0, np.sqrt(len(feats)))
  return out


def next_obs_text(traj: types.Trajectory, k: int, fmt=FORMAT) -> str:
  """The observation text after step k: the next step's prompt, or after the last step the prompt `fmt` (the
  actor's) would have built (the code's `next_observation`; a text observation's final page is not stored)."""
  if k + 1 < len(traj.steps):
    return traj.steps[k + 1].obs_text
  return fmt.build_prompt(traj.task, None, traj.steps)


def returns(traj: types.Trajectory, gamma: float) -> tuple[np.ndarray, np.ndarray]:
  """(r, G): the terminal reward 1[success] on the last step, G_t = Σ_k γ^{k−t} r_k (`env_utils.add_mc_return`)."""
  n = len(traj.steps)
  r = np.zeros(n, np.float32)
  if n:
    r[-1] = float(traj.success == 1.0)
  g = r[-1] * gamma ** np.arange(n - 1, -1, -1, dtype=np.float32) if n else r
  return r, g.astype(np.float32)


def step_arrays(trajs: Sequence[types.Trajectory], screens: Sequence[np.ndarray], text_dim: int, gamma: float,
                fmt=FORMAT) -> dict[str, np.ndarray]:
  """The step critic's rows, one per step: `text`, `image` and `next_*` of s and s', `reward`, `mc_return`, `label`,
  the trajectory's `final_reward` and `last_step`, and `index` (trajectory, step). `screens[i]`: trajectory i's image features, [T_i + 1, D] (the states, then the
  final screen)."""
  obs, nxt, image, next_image, reward, ret, index, final, last = [], [], [], [], [], [], [], [], []
  for i, (traj, f) in enumerate(zip(trajs, screens)):
    r, g = returns(traj, gamma)
    for k, step in enumerate(traj.steps):
      obs.append(step.obs_text)
      nxt.append(next_obs_text(traj, k, fmt))
      image.append(f[k])
      next_image.append(f[k + 1])
      reward.append(r[k])
      ret.append(g[k])
      index.append((i, k))
      final.append(r[-1])
      last.append(len(traj.steps) - 1)
  ret_a = np.asarray(ret, np.float32)
  stacked, next_stacked = transitions.frame_stack(np.asarray(index, np.int32).reshape(-1, 2),
                                                  np.asarray(image, np.float32), np.asarray(next_image, np.float32))
  return {"text": bag_of_words(obs, text_dim), "next_text": bag_of_words(nxt, text_dim),
          "image": stacked, "next_image": next_stacked,
          "reward": np.asarray(reward, np.float32), "mc_return": ret_a, "label": (ret_a > 0).astype(np.float32),
          "index": np.asarray(index, np.int32).reshape(-1, 2), "final_reward": np.asarray(final, np.float32),
          "last_step": np.asarray(last, np.float32)}


def trajectory_arrays(trajs: Sequence[types.Trajectory], text_dim: int) -> dict[str, np.ndarray]:
  """The instruction critic's rows: the first observation's text and 1[G_last > 0], one per trajectory."""
  first = [t.steps[0].obs_text if t.steps else FORMAT.build_prompt(t.task, None, []) for t in trajs]
  return {"text": bag_of_words(first, text_dim),
          "label": np.asarray([float(t.success == 1.0) for t in trajs], np.float32)}


# ---------------------------------------------------------------------------------------------- models


class TrajectoryCritic(nnx.Module):
  """V^inst(c): text → tanh(Dense) (the trainable encoder's pooler) → Dense(2)."""

  def __init__(self, text_dim: int, hidden: int, seed: int):
    rngs = nnx.Rngs(seed)
    self.pooler = nnx.Linear(text_dim, hidden, rngs=rngs)
    self.head = nnx.Linear(hidden, 2, rngs=rngs)

  def __call__(self, text: jax.Array) -> jax.Array:
    return self.head(jnp.tanh(self.pooler(text)))


class _Head(nnx.Module):
  def __init__(self, d_in: int, hidden: int, rngs: nnx.Rngs):
    self.l1, self.l2 = nnx.Linear(d_in, hidden, rngs=rngs), nnx.Linear(hidden, hidden, rngs=rngs)
    self.out = nnx.Linear(hidden, 2, rngs=rngs)

  def __call__(self, x):
    return self.out(jax.nn.relu(self.l2(jax.nn.relu(self.l1(x)))))


class StepCritic(nnx.Module):
  """V^step(s): two heads MLP([text ‖ image] → h → h → 2) (`digirl/models/critic.py:VLMDoubleCritic`)."""

  def __init__(self, text_dim: int, image_dim: int, hidden: int, seed: int):
    rngs = nnx.Rngs(seed)
    self.head1 = _Head(text_dim + image_dim, hidden, rngs)
    self.head2 = _Head(text_dim + image_dim, hidden, rngs)

  def __call__(self, text: jax.Array, image: jax.Array) -> tuple[jax.Array, jax.Array]:
    x = jnp.concatenate([text, image], -1)
    return self.head1(x), self.head2(x)


def trajectory_critic_loss(model: TrajectoryCritic, batch, rng=None):
  del rng
  logits = model(batch["text"])
  acc = jnp.mean((jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32))
  return losses.value_ce(logits, batch["label"]), {"accuracy": acc}


def step_critic_loss(model: StepCritic, batch, rng=None):
  """CE(h1(s), y) + CE(h2(s), y) + CE(h1(s'), y) + CE(h2(s'), y), y the label of s (`trainer.py:critic_loss`)."""
  del rng
  h1, h2 = model(batch["text"], batch["image"])
  n1, n2 = model(batch["next_text"], batch["next_image"])
  y = batch["label"]
  acc = jnp.mean((jnp.argmax(h1, -1) == y).astype(jnp.float32))
  return losses.value_ce_double(h1, h2, y) + losses.value_ce_double(n1, n2, y), {"accuracy": acc}


# ------------------------------------------------------------------------------------------- training


def train(config, workdir: str, arrays: Mapping[str, np.ndarray], model_fn, loss_fn, start=None) -> nnx.Module:
  """Trains the critic `model_fn()` (or the module `start`, to continue an earlier one) on the rows of `arrays`
  for `config.train.steps` with the shared loop; returns the trained module. `config`: a `stage_config`."""
  rows = {k: arrays[k] for k in ("text", "image", "next_text", "next_image", "label") if k in arrays}
  ds = pipeline.rows_dataset(rows, batch_size=int(config.train.batch_size), seed=int(config.seed))
  pretrained = (lambda: loop.on_host(start)) if start is not None else None
  loop.train(config, workdir, model_fn=model_fn, loss_fn=loss_fn, dataset=ds, pretrained=pretrained)
  return loop.restore_model(config, workdir, model_fn)


def trajectory_values(model: TrajectoryCritic, text: np.ndarray) -> np.ndarray:
  """V^inst = softmax(logits)[1] per row."""
  return np.asarray(jax.nn.softmax(nnx.jit(lambda m, t: m(t))(model, jnp.asarray(text)), -1)[:, 1])


def step_values(model: StepCritic, arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """(V(s), V(s')): min over the two heads of softmax[1] (`losses.double_value_prob`, "min")."""
  value = nnx.jit(lambda m, t, i: losses.double_value_prob(*m(t, i), "min"))
  return (np.asarray(value(model, jnp.asarray(arrays["text"]), jnp.asarray(arrays["image"]))),
          np.asarray(value(model, jnp.asarray(arrays["next_text"]), jnp.asarray(arrays["next_image"]))))


# ---------------------------------------------------------------------------------- advantage, filters


def step_weights(v: np.ndarray, v_next: np.ndarray, arrays: Mapping[str, np.ndarray], kind: str = "code",
                 gamma: float = 0.5, horizon: int = 10) -> tuple[np.ndarray, np.ndarray]:
  """(A, w) per step. `kind="code"`: A = V(s') − V(s) − 0.05 + r + G_t, w = 1[clamp(A, 0, 1) > 0];
  `kind="dr"`: the paper's A = λ^{H−h} r_H + (1 − λ^{H−h})(V(s') + r − V(s)) with λ = γ, h the step and H the
  trajectory's last step, w = 1[A > 1/`horizon`] (the episode horizon, `tasks.max_steps`)."""
  r, g = jnp.asarray(arrays["reward"]), jnp.asarray(arrays["mc_return"])
  v, v_next = jnp.asarray(v), jnp.asarray(v_next)
  if kind == "code":
    adv = losses.digirl_advantage_code(v, v_next, r, g, ADVANTAGE_C)
    return np.asarray(adv), np.asarray(losses.digirl_weights_code(adv))
  if kind != "dr":
    raise ValueError(f"actor.advantage={kind!r}: use 'code' or 'dr'")
  adv = losses.digirl_advantage_dr(v, v_next, r, jnp.asarray(arrays["final_reward"]), gamma,
                                   jnp.asarray(arrays["last_step"]), jnp.asarray(arrays["index"][:, 1]))
  return np.asarray(adv), np.asarray(losses.digirl_weights_dr(adv, horizon))


def filterbc_keep(trajs: Sequence[types.Trajectory], q: float = 0.9) -> np.ndarray:
  """Trajectories whose reward is ≥ the q-quantile of the rewards (`filterbc_buffer`): with 0/1 rewards the
  successes, or every trajectory when fewer than 1 − q succeed (the code's quirk, kept)."""
  rewards = np.asarray([float(t.success == 1.0) for t in trajs], np.float32)
  return np.asarray(losses.topk_quantile_filter(rewards, q))


def digirl_keep(trajs: Sequence[types.Trajectory], v_inst: np.ndarray, q: float = 0.9) -> np.ndarray:
  """Trajectories whose reward − clamp(V^inst, 1e-4, 1 − 1e-4) is ≥ its q-quantile (`filter_buffer`): the
  successes on instructions the critic finds hardest first."""
  rewards = np.asarray([float(t.success == 1.0) for t in trajs], np.float32)
  return np.asarray(losses.topk_quantile_filter(rewards - np.clip(v_inst, 1e-4, 1 - 1e-4), q))
