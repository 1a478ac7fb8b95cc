"""Digi-Q's critic (`reference/algorithms.md` §5.3–5.4) trained on the shared loop, and Best-of-N's scores (§5.5).

Rows are the behaviour data's transitions (s, a_data, r, s', done) with the terminal reward 1 on a judged success,
0 otherwise; Q sees the frozen (s, a) representation of the dataset action, V the state only. The trained module
holds the online critic and its target (`CriticWithTarget`): the optimizer trains the online one, and the target
follows it by Polyak averaging (τ) every `target_every` steps inside the same jitted step, so Grain batches, the
mesh, Orbax checkpoints (a killed stage resumes) and TensorBoard are the ones every training uses.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import types
from jaxagent.agents import autoui
from jaxagent.data import pipeline
from jaxagent.models.critic import CriticConfig, DigiQCritic
from jaxagent.proj.digiq.features import featurize
from jaxagent.rl import losses
from jaxagent.rl.returns import mc_return
from jaxagent.rl.targets import polyak_update
from jaxagent.train import loop

ONLINE = nnx.All(nnx.Param, nnx.PathContains("online"))  # what the optimizer trains


class CriticWithTarget(nnx.Module):
  """The online critic and its target network, which starts as a copy (Digi-Q deep-copies the critic)."""

  def __init__(self, cfg: CriticConfig, seed: int):
    self.online = DigiQCritic(cfg, rngs=nnx.Rngs(seed))
    self.target = nnx.clone(self.online)


def polyak_every(tau: float, every: int):
  """`after_update`: target ← (1 − τ) target + τ online once every `every` optimizer steps."""

  def update(model: CriticWithTarget, step: jax.Array) -> None:
    target, online = nnx.state(model.target, nnx.Param), nnx.state(model.online, nnx.Param)
    moved = polyak_update(target, online, tau)
    nnx.update(model.target, jax.tree.map(lambda m, t: jnp.where(step % every == 0, m, t), moved, target))

  return update


def head_scores(critic: DigiQCritic, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
  """Per-head scalar values (q [B, (N,) 2], v [B, 2]): the raw output for regression, softmax[1] for
  classification (§5.5), the inputs of `losses.best_of_n_select`."""
  q1, q2, v1, v2 = critic(batch)
  hv = lambda x: losses.head_value(x, critic.learn_metric)
  return jnp.stack([hv(q1), hv(q2)], -1), jnp.stack([hv(v1), hv(v2)], -1)


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


def critic_config(config, cache: Mapping[str, np.ndarray]) -> CriticConfig:
  c = config.critic
  return CriticConfig(text_dim=int(c.text_dim), image_dim=int(cache["image"].shape[-1]),
                      rep_dim=int(cache["reps"].shape[-1]), out_dim=1 if c.learn_metric == "regression" else 2,
                      text_encoder=str(c.text_encoder), point_octaves=int(c.point_octaves))


def transition_arrays(trajs: Sequence[types.Trajectory], cache: Mapping[str, np.ndarray], cfg: CriticConfig,
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
  data = featurize(obs, [c[0] for c in cands], cfg)
  allc = featurize(obs, cands, cfg)
  for key in ("type", "text", "point"):
    if "act_" + key in allc:
      data["cand_" + key] = allc["act_" + key]
  nx = featurize(nxt, [c[0] for c in cands], cfg)
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


def train_critic(config, workdir: str, data: Mapping[str, np.ndarray], cfg: CriticConfig) -> CriticWithTarget:
  """Trains the critic for `config.train.steps` (a `pipeline.stage_config` of `config.critic`) on `data`'s rows
  with `loop.train` in `workdir`; returns the trained module (restored from the final checkpoint)."""
  c = config.critic
  gamma, backup, adv = float(c.gamma), str(c.backup), str(c.advantage_estimation)

  def loss_fn(model: CriticWithTarget, batch, rng):
    cur, nxt = _split(batch)
    return td_loss(model.online, model.target, cur, nxt, cur["reward"], cur["done"], gamma, backup=backup,
                   key=rng, mc_return=cur["mc_return"], advantage_estimation=adv)

  rows = {k: v for k, v in data.items() if k != "valid"}
  ds = pipeline.rows_dataset(rows, batch_size=int(config.train.batch_size), seed=int(config.seed))
  model_fn = lambda: CriticWithTarget(cfg, int(config.seed))
  loop.train(config, workdir, model_fn=model_fn, loss_fn=loss_fn, dataset=ds, wrt=ONLINE,
             after_update=polyak_every(float(c.tau), int(c.target_every)))
  return restore(config, workdir, model_fn)


def restore(config, workdir: str, model_fn) -> CriticWithTarget:
  """The critic of `workdir`'s latest checkpoint."""
  return loop.restore_model(config, workdir, model_fn, wrt=ONLINE)


def score_candidates(critic: DigiQCritic, data: Mapping[str, np.ndarray], batch: int = 256
                     ) -> tuple[np.ndarray, np.ndarray]:
  """(q [M, N, 2], v [M, 2]): both heads' values of every candidate and state (`head_scores`)."""
  score = nnx.jit(head_scores)
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


def best_of_n(actor, scores: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(chosen candidate, its advantage, its actor weight) per scored state (§5.5) under `config.actor`."""
  idx, adv = losses.best_of_n_select(jnp.asarray(scores["q"]), jnp.asarray(scores["v"]),
                                     jnp.asarray(scores["valid"]), str(actor.head_reduce), True)
  weight = losses.best_of_n_weights(adv, str(actor.loss), float(actor.threshold), float(actor.pg_multiplier),
                                    float(actor.awr_beta))
  idx, adv, weight = np.asarray(idx), np.asarray(adv), np.asarray(weight)
  if not np.all(np.isfinite(weight)):  # awr's exp(A / β): e^88.7 is float32's largest
    raise ValueError(f"actor.loss={actor.loss!r} with actor.awr_beta={actor.awr_beta} gives infinite weights: "
                     f"exp(A / β) overflows float32 for advantages above {88.7 * float(actor.awr_beta):.3f} (the "
                     f"largest here is {float(adv.max()):.3f}); raise actor.awr_beta")
  return idx, adv, weight
