"""Digi-Q's critic (`reference/algorithms.md` §5.3–5.4) trained on the shared loop, and Best-of-N's scores (§5.5).

Rows are the behaviour data's transitions (s, a_data, r, s', done) with the terminal reward 1 on a judged success,
0 otherwise; Q sees the frozen (s, a) representation of the dataset action, V the state only. The trained module
holds the online critic and its target (`CriticWithTarget`): the optimizer trains the online one, and the target
follows it by Polyak averaging (τ) every `target_every` steps inside the same jitted step, so Grain batches, the
mesh, Orbax checkpoints (a killed stage resumes) and TensorBoard are the ones every training uses.

Three choices follow the original code by default, each with the earlier behaviour as an option
(`config.critic`):
  frame_stack   a state's image features are [previous screen ‖ current screen], s' gets [f_t ‖ f_{t+1}]
                (`digiq/algorithms/offpolicy_train_loop.py:framestack`); False: the current screen only.
  val_fraction  that fraction of the trajectories is held out of training and scored with the training loss as a
                validation set (`offpolicy_train_loop.py` keeps the first 80 % for the replay buffer, the rest
                for the validation buffer that `trainer.py:update_critic` only evaluates); 0.0: train on all.
  target_init   "random": the target is a second critic built from the seed's next draws, as
                `digiq/models/autoui_agent.py` constructs a second `VLMDoubleCritic` (its randomly initialised
                parts differ from the online critic's); "copy": a clone of the online critic.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import types
from jaxagent.agents import autoui
from jaxagent.data import pipeline, transitions
from jaxagent.models.critic import CriticConfig, DigiQCritic
from jaxagent.proj.digiq.features import featurize
from jaxagent.rl import losses
from jaxagent.rl.returns import mc_return
from jaxagent.rl.targets import polyak_update
from jaxagent.train import loop
from jaxagent.train.metrics import MetricWriter

ONLINE = nnx.All(nnx.Param, nnx.PathContains("online"))  # what the optimizer trains
TARGET_INITS = ("random", "copy")


class CriticWithTarget(nnx.Module):
  """The online critic and its target network.

  `target_init="random"` (the code): the target is built like the online critic from the same `nnx.Rngs`, so its
  parameters are the seed's next draws. `digiq/models/autoui_agent.py:AutoUIAgent.__init__` constructs
  `target_critic` as a second `VLMDoubleCritic`, never copied from `critic`: its MLP heads (and the RoBERTa
  poolers, which roberta-base's checkpoint lacks) start from their own random init, only the pretrained RoBERTa
  bodies coincide; our text encoders have no pretrained weights, so every part of the target differs.
  `"copy"`: the target starts equal to the online critic. The online critic is the same in both.
  """

  def __init__(self, cfg: CriticConfig, seed: int, target_init: str = "random"):
    if target_init not in TARGET_INITS:
      raise ValueError(f"critic.target_init={target_init!r}: use 'random' (the code's own init for the target) or "
                       "'copy' (a clone of the online critic)")
    rngs = nnx.Rngs(seed)
    self.online = DigiQCritic(cfg, rngs=rngs)
    self.target = DigiQCritic(cfg, rngs=rngs) if target_init == "random" else nnx.clone(self.online)


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
  """The critic's sizes for `config.critic` over the representation cache; `frame_stack` doubles the image
  features' width."""
  c = config.critic
  image_dim = int(cache["image"].shape[-1]) * (2 if bool(c.frame_stack) else 1)
  return CriticConfig(text_dim=int(c.text_dim), image_dim=image_dim,
                      rep_dim=int(cache["reps"].shape[-1]), out_dim=1 if c.learn_metric == "regression" else 2,
                      text_encoder=str(c.text_encoder), point_octaves=int(c.point_octaves))


def transition_arrays(trajs: Sequence[types.Trajectory], cache: Mapping[str, np.ndarray], cfg: CriticConfig,
                      gamma: float, frame_stack: bool = True) -> dict[str, np.ndarray]:
  """Host-side arrays of every row: critic text features of s (with the dataset action and with all N
  candidates) and of s', image features (with `frame_stack`, [f_{t−1} ‖ f_t] and [f_t ‖ f_{t+1}]:
  `transitions.frame_stack`), reward, done, MC return and candidate validity."""
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
  if frame_stack:
    data["image_features"], data["next_image_features"] = transitions.frame_stack(cache["rows"], cache["image"],
                                                                                  cache["next_image"])
  else:
    data["image_features"], data["next_image_features"] = cache["image"], cache["next_image"]
  if data["image_features"].shape[-1] != cfg.image_dim:
    raise ValueError(f"transition_arrays: image features of width {data['image_features'].shape[-1]} (frame_stack="
                     f"{frame_stack}) but CriticConfig.image_dim={cfg.image_dim}; build the config with "
                     "`critic_config` from the same config.critic.frame_stack")
  data["cand_rep"] = cache["reps"]
  data["q_rep"] = cache["reps"][:, 0]
  data["reward"] = np.asarray(reward, np.float32)
  data["done"] = np.asarray(done, np.float32)
  data["mc_return"] = np.asarray(ret, np.float32)
  data["valid"] = np.asarray([[autoui.is_action_valid(a) for a in c] for c in cands], bool)
  return data


def held_out_rows(rows: np.ndarray, val_fraction: float, seed: int) -> np.ndarray:
  """bool [M]: the rows of the trajectories held out of the critic's training (`transitions.held_out_trajectories`
  over the trajectories that have rows), whole trajectories at a time as `offpolicy_train_loop.py` splits them."""
  if not 0.0 <= val_fraction < 1.0:
    raise ValueError(f"critic.val_fraction={val_fraction} must lie in [0, 1): the fraction of trajectories held out "
                     "as the critic's validation set (0.0 trains on all)")
  traj = np.asarray(rows).reshape(-1, 2)[:, 0]
  held = np.isin(traj, transitions.held_out_trajectories(traj, val_fraction, seed))
  if len(held) and held.all():
    raise ValueError(f"critic.val_fraction={val_fraction} leaves none of the {len(np.unique(traj))} trajectories "
                     "for training; lower critic.val_fraction or collect more behaviour.episodes")
  return held


def take_rows(data: Mapping[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
  """The rows of `data` where `mask` is true."""
  return {k: v[mask] for k, v in data.items()}


def _split(batch):
  nxt = {k[len("next_"):]: v for k, v in batch.items() if k.startswith("next_")}
  cur = {k: v for k, v in batch.items() if not k.startswith("next_")}
  return cur, nxt


def critic_loss_fn(config):
  """`loss_fn(model, batch, rng)` of `config.critic`: `td_loss` on a batch of `transition_arrays` rows, the one
  loss both training and validation use."""
  c = config.critic
  gamma, backup, adv = float(c.gamma), str(c.backup), str(c.advantage_estimation)

  def loss_fn(model: CriticWithTarget, batch, rng):
    cur, nxt = _split(batch)
    return td_loss(model.online, model.target, cur, nxt, cur["reward"], cur["done"], gamma, backup=backup,
                   key=rng, mc_return=cur["mc_return"], advantage_estimation=adv)

  return loss_fn


def _loss_rows(data: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {k: v for k, v in data.items() if k != "valid"}


def train_critic(config, workdir: str, data: Mapping[str, np.ndarray], cfg: CriticConfig) -> CriticWithTarget:
  """Trains the critic for `config.train.steps` (a `pipeline.stage_config` of `config.critic`) on `data`'s rows
  with `loop.train` in `workdir`; returns the trained module (restored from the final checkpoint)."""
  c = config.critic
  ds = pipeline.rows_dataset(_loss_rows(data), batch_size=int(config.train.batch_size), seed=int(config.seed))
  model_fn = lambda: CriticWithTarget(cfg, int(config.seed), str(c.target_init))
  loop.train(config, workdir, model_fn=model_fn, loss_fn=critic_loss_fn(config), dataset=ds, wrt=ONLINE,
             after_update=polyak_every(float(c.tau), int(c.target_every)))
  return restore(config, workdir, model_fn)


def validation_loss(config, critic: CriticWithTarget, data: Mapping[str, np.ndarray], batch: int = 1024
                    ) -> dict[str, float]:
  """The training loss (`critic_loss_fn`) over every row of `data` (the held-out trajectories' rows): its mean and
  the per-head means. `trainer.py:update_critic` evaluates `critic_loss(validation=True)` on 128 rows drawn with
  replacement from the validation buffer; every row once gives the same expectation without the noise."""
  loss_fn = nnx.jit(critic_loss_fn(config))
  rows = _loss_rows(data)
  n = len(rows["reward"])
  if not n:
    raise ValueError("validation_loss: no held-out rows (critic.val_fraction=0.0 holds none out)")
  key = jax.random.key(int(config.seed))  # backup="sample" draws its candidate from it
  totals: dict[str, float] = {}
  for start in range(0, n, batch):
    chunk = {k: jnp.asarray(v[start:start + batch]) for k, v in rows.items()}
    loss, parts = loss_fn(critic, chunk, key)
    share = len(chunk["reward"]) / n  # every term is a mean over the chunk's rows
    for name, value in {"loss": loss, **parts}.items():
      totals[name] = totals.get(name, 0.0) + share * float(value)
  return totals


def log_validation(config, workdir: str, critic: CriticWithTarget, data: Mapping[str, np.ndarray]) -> dict[str, float]:
  """`validation_loss` on `data`, written as `val/*` scalars at the final step to `workdir`'s TensorBoard and
  `metrics.jsonl` beside the training curves (the original logs it to wandb as `validation.*`)."""
  values = validation_loss(config, critic, data)
  writer = MetricWriter(workdir)
  writer.write_scalars(int(config.train.steps), {f"val/{k}": v for k, v in values.items()})
  writer.close()
  return values


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
