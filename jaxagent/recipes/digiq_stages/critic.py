"""The critic stage (`reference/algorithms.md` §5.3–5.4) and the candidates' scores for Best-of-N (§5.5).

Rows are the behaviour data's transitions (s, a_data, r, s', done) with the terminal reward 1 on a judged
success (the programmatic evaluator), 0 otherwise; Q sees the frozen (s, a) representation of the dataset
action, V the state only. Loss: `models.critic.td_loss` (the code's bellman form by default; the paper's J_V
via `critic.backup`, MC regression via `critic.advantage_estimation`), Adam with clipping, and a target
critic moved by Polyak averaging (`rl.targets.soft_update`, τ) every `target_every` steps.
"""

from __future__ import annotations

import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxagent import types
from jaxagent.agents import autoui
from jaxagent.models import critic as critic_lib
from jaxagent.rl import targets
from jaxagent.rl.returns import mc_return


def transition_arrays(trajs: Sequence[types.Trajectory], cache: dict[str, np.ndarray], cfg: critic_lib.CriticConfig,
                      gamma: float) -> dict[str, np.ndarray]:
  """Host-side arrays of every row: critic text features of s (with the dataset action and with all N
  candidates) and of s', image features, reward, done, MC return and candidate validity."""
  rows = [tuple(r) for r in cache["rows"]]
  obs, nxt, cands, reward, done, ret = [], [], [], [], [], []
  for i, k in rows:
    traj, step = trajs[i], trajs[i].steps[k]
    last = k == len(traj.steps) - 1
    r = np.zeros(len(traj.steps), np.float32)
    r[-1] = float(traj.success == 1.0)
    obs.append(step.obs_text)
    nxt.append(step.obs_text if last else traj.steps[k + 1].obs_text)
    cands.append(list(step.candidates))
    reward.append(r[k])
    done.append(float(last))
    ret.append(mc_return(r, gamma)[k])
  data = critic_lib.featurize(obs, [c[0] for c in cands], cfg)
  allc = critic_lib.featurize(obs, cands, cfg)
  for key in ("type", "text", "point"):
    if "act_" + key in allc:
      data["cand_" + key] = allc["act_" + key]
  nx = critic_lib.featurize(nxt, [c[0] for c in cands], cfg)
  for key in ("goal", "prev_type", "prev_text", "prev_point"):
    if key in nx:
      data["next_" + key] = nx[key]
  data["image_features"] = cache["image"]
  data["next_image_features"] = cache["next_image"]
  data["cand_rep"] = cache["reps"]
  data["q_rep"] = cache["reps"][:, 0]
  data["reward"] = np.asarray(reward, np.float32)
  data["done"] = np.asarray(done, np.float32)
  data["mc_return"] = np.asarray(ret, np.float32)
  data["valid"] = np.asarray([[autoui.is_action_valid(a) for a in c] for c in cands], bool)
  return data


def _split(batch):
  nxt = {k[len("next_"):]: v for k, v in batch.items() if k.startswith("next_")}
  cur = {k: v for k, v in batch.items() if not k.startswith("next_")}
  return cur, nxt


def train_critic(config, data: dict[str, np.ndarray], cfg: critic_lib.CriticConfig, writer=None):
  """Returns the trained critic (online network) after `config.critic.steps` Adam steps."""
  c = config.critic
  critic = critic_lib.DigiQCritic(cfg, rngs=nnx.Rngs(int(config.seed)))
  target = nnx.clone(critic)
  tx = optax.chain(optax.clip_by_global_norm(float(c.clip_norm)) if c.clip_norm else optax.identity(),
                   optax.adam(float(c.lr)))
  opt = nnx.Optimizer(critic, tx, wrt=nnx.Param)
  gamma, backup, adv = float(c.gamma), str(c.backup), str(c.advantage_estimation)

  @nnx.jit
  def step(critic, target, opt, batch, key):
    cur, nxt = _split(batch)

    def loss_fn(model):
      return critic_lib.td_loss(model, target, cur, nxt, cur["reward"], cur["done"], gamma, backup=backup,
                                key=key, mc_return=cur["mc_return"], advantage_estimation=adv)

    (loss, parts), grads = nnx.value_and_grad(loss_fn, has_aux=True)(critic)
    opt.update(critic, grads)
    return loss, parts

  @nnx.jit
  def polyak(target, critic):
    targets.soft_update(target, critic, float(c.tau))

  keys = [k for k in data if k not in ("valid",)]
  m = len(data["reward"])
  rng = np.random.default_rng(int(config.seed))
  key = jax.random.key(int(config.seed))
  bs = min(int(c.batch_size), m)
  for t in range(int(c.steps)):
    idx = rng.choice(m, bs, replace=m < bs)
    batch = {k: jnp.asarray(data[k][idx]) for k in keys}
    loss, parts = step(critic, target, opt, batch, jax.random.fold_in(key, t))
    if (t + 1) % int(c.target_every) == 0:
      polyak(target, critic)
    if writer is not None and (t % 10 == 0 or t == int(c.steps) - 1):
      writer.write_scalars(t, {"critic/loss": float(loss), **{f"critic/{k}": float(v) for k, v in parts.items()}})
  return critic


def score_candidates(critic: critic_lib.DigiQCritic, data: dict[str, np.ndarray], batch: int = 256
                     ) -> tuple[np.ndarray, np.ndarray]:
  """(q [M, N, 2], v [M, 2]): both heads' values of every candidate and state (`DigiQCritic.scores`)."""
  score = nnx.jit(lambda model, b: model.scores(b))
  names = {"goal": "goal", "prev_type": "prev_type", "prev_text": "prev_text", "prev_point": "prev_point",
           "image_features": "image_features", "act_type": "cand_type", "act_text": "cand_text",
           "act_point": "cand_point", "q_rep": "cand_rep"}
  qs, vs = [], []
  for s in range(0, len(data["reward"]), batch):
    b = {k: jnp.asarray(data[src][s:s + batch]) for k, src in names.items() if src in data}
    q, v = score(critic, b)
    qs.append(np.asarray(q))
    vs.append(np.asarray(v))
  return np.concatenate(qs), np.concatenate(vs)


def save_params(critic, path: str) -> None:
  """The online critic's parameters, one array per `jax.tree_util.keystr` path."""
  leaves = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(critic, nnx.Param)))[0]
  np.savez(path + ".tmp.npz", **{jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves})
  os.replace(path + ".tmp.npz", path)
