"""The GRPO learner: the policy's sampled tokens → clipped policy-gradient updates → weights handed to the policy.

Every sample is one step of a rollout as it was sampled (token in, token out: `Step.prompt_ids`, `reply_ids` and
the behaviour log-probs `reply_logprobs`), with its group-relative advantage; nothing is re-tokenised. The loss is
`rl.losses.ppo_clip_loss` on log π_θ at the rollout temperature, with the k3 KL to the reference policy (the start
of the run, scored once per round before any update) when `kl_coef` > 0; Dr. GRPO's aggregation divides by the
generation budget `sampling.max_tokens`, the same every round. A round trains at its longest step's length (the
sampler takes any prompt the model's context holds), so no step sampled is refused after its rollouts. A round's rollouts sampled by weights
older than the learner's (`max_lag` > 0) train with decoupled PPO: the proximal policy (the weights at the round's
first update) is scored and the behaviour log-probs weight each token.

The learner's state lives in memory across rounds (`weights()` hands it to the acting policy without a checkpoint);
an Orbax checkpoint of it is written every `checkpoint_every` rounds and at the end, in a workdir the loaders read
(`config.json`, `tokenizer/`, `agent.json`, `checkpoints/<round>`).

Under `jax.distributed` every process holds the round's rows (the union of all processes' rollouts) and feeds its
own share of each minibatch (`process_rows`), so a process count of P trains on the configured batch, each row
once; the reference and proximal scoring is sharded the same way, and `weights()` gathers the learner's arrays
onto every process's host for its own acting policy (the broadcast).
"""

from __future__ import annotations

import math
import os
import shutil
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import models, sharding
from jaxagent.agents import spec as agent_spec
from jaxagent.agents.base import AgentFormat
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.pipeline import distributed
from jaxagent.pipeline.stages import write_text
from jaxagent.rl import losses
from jaxagent.serving.checkpoint import load_policy
from jaxagent.train.checkpoint import Checkpointer
from jaxagent.train.metrics import MetricWriter
from jaxagent.train.optim import make_optimizer
from jaxagent.train.state import create_train_state_from_model, abstract_train_state
from jaxagent.train.step import batch_shardings, build_train_step, put_batch


def _bucket(n: int) -> int:
  """Sequence lengths compiled: multiples of 64 (a handful of programs a run)."""
  return max(64, -(-int(n) // 64) * 64)


def token_batch(rows: Sequence[dict], length: int, pad_id: int) -> dict[str, np.ndarray]:
  """Rows `{prompt_ids, reply_ids, logprobs, advantage}` → the arrays one update reads: `input_ids` = prompt +
  reply without its last token, `targets` shifted by one, `loss_mask` on the reply's tokens, `behaviour_logp` the
  sampled log-probs aligned with their targets, `advantage` per row."""
  b = len(rows)
  out = {"input_ids": np.full((b, length), pad_id, np.int32), "attention_mask": np.zeros((b, length), bool),
         "targets": np.zeros((b, length), np.int32), "loss_mask": np.zeros((b, length), np.float32),
         "behaviour_logp": np.zeros((b, length), np.float32), "advantage": np.zeros((b,), np.float32)}
  for r, row in enumerate(rows):
    prompt, reply = list(row["prompt_ids"]), list(row["reply_ids"])
    tokens = prompt + reply
    if len(tokens) - 1 > length:
      raise ValueError(f"a step has {len(tokens) - 1} tokens but the batch holds {length}; give a length of at "
                       "least the longest step's")
    n, p = len(tokens) - 1, len(prompt)
    out["input_ids"][r, :n] = tokens[:-1]
    out["attention_mask"][r, :n] = True
    out["targets"][r, :n] = tokens[1:]
    out["loss_mask"][r, p - 1:n] = 1.0
    out["behaviour_logp"][r, p - 1:n] = row["logprobs"]
    out["advantage"][r] = row["advantage"]
  return out


def process_rows(idx: np.ndarray, index: int, count: int) -> np.ndarray:
  """Process `index`'s share of a global minibatch's row indices `idx`: the contiguous block `put_batch` places
  on its devices (processes split the leading axis evenly, in process order)."""
  if len(idx) % count:
    raise ValueError(f"grpo.train.batch_size={len(idx)} does not split over {count} processes; make it a multiple "
                     f"of {count}")
  per = len(idx) // count
  return idx[index * per:(index + 1) * per]


def _gathered(x: jax.Array) -> np.ndarray:
  """A global array's value on this process's host (an all-gather across processes when it spans several)."""
  if x.is_fully_addressable:
    return np.asarray(x)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _token_logp(model, batch: dict, temperature: float) -> jax.Array:
  logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits / temperature, -1)
  return jnp.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]


class Learner:
  """The trained policy's state across rounds: `update(rows)` runs a round's clipped updates, `weights()` gives
  the acting policy the current weights, `save(round)` checkpoints (at the interval, or `force`)."""

  def __init__(self, config, stage_config, init_from: str, workdir: str, fmt: AgentFormat):
    self.cfg, self.workdir = config.grpo, workdir
    self.temperature = float(config.grpo.temperature)
    os.makedirs(workdir, exist_ok=True)
    tok_dir = os.path.join(workdir, "tokenizer")
    if distributed.is_main():  # the workdir is shared: one process writes it, the others read it after the barrier
      if not os.path.isdir(tok_dir):
        shutil.copytree(os.path.join(init_from, "tokenizer"), tok_dir)
      write_text(os.path.join(workdir, "config.json"), stage_config.to_json_best_effort(indent=2))
    distributed.barrier(f"grpo learner: {workdir} written")
    tokenizer = load_tokenizer(tok_dir, require_image_token=str(stage_config.model.kind) == "vlm")  # SmolLM2's: none
    if distributed.is_main():
      agent_spec.write(workdir, fmt, getattr(tokenizer, "chat_template", None))
    self.pad_id = int(tokenizer.pad_token_id or 0)
    self.norm_len = int(config.sampling.max_tokens)  # Dr. GRPO's constant: the generation budget
    self.minibatch = int(stage_config.train.batch_size)
    process_rows(np.arange(self.minibatch), 0, jax.process_count())  # refused before the round's rollouts
    built = models.build(stage_config, tokenizer)
    self.mesh = sharding.make_mesh(dict(stage_config.mesh))
    tx, self.schedule = make_optimizer(stage_config.optim, int(stage_config.train.steps))
    self.ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), every=int(self.cfg.checkpoint_every), keep=2,
                             async_save=False)
    self.rng = jax.random.key(int(stage_config.seed))
    start = load_policy(init_from, mesh=self.mesh).model  # on the learner's mesh: the reference's scoring is
    self.reference = start if float(self.cfg.kl_coef) > 0 else None  # sharded as the updates are
    if self.ckpt.latest_step() is not None:
      self.ts = abstract_train_state(built.init, tx, self.mesh, wrt=built.trainable)
      self.ts.state, self.rng, _, _ = self.ckpt.restore(self.ts.abstract_state(), self.rng)
    else:
      self.ts = create_train_state_from_model(start, tx, self.mesh, wrt=built.trainable)
    self.round = int(self.ckpt.latest_step() or 0)
    self.wrt = built.trainable
    self._step = None
    self._score = jax.jit(lambda model, batch: _token_logp(model, batch, self.temperature))
    self.writer = MetricWriter(workdir)

  def weights(self):
    """A snapshot of the current model's state, for `ModelPolicy.set_weights`: copies, since the next update
    donates the learner's buffers (a lagged policy acts with a snapshot several updates old). Under
    `jax.distributed` the arrays span every process's devices and each process's policy acts on its own: every
    process gets the values on its host (call it on every process)."""
    state = nnx.state(self.ts.model())
    if jax.process_count() == 1:
      return jax.tree.map(jnp.copy, state)
    return jax.tree.map(_gathered, state)

  def _loss(self, model, batch, rng):
    del rng
    logp = _token_logp(model, batch, self.temperature)
    decoupled = "proximal_logp" in batch
    loss, aux = losses.ppo_clip_loss(
        logp, batch["proximal_logp"] if decoupled else batch["behaviour_logp"], batch["advantage"],
        batch["loss_mask"], float(self.cfg.clip_low), float(self.cfg.clip_high),
        behaviour_logp_tok=batch["behaviour_logp"] if decoupled else None,
        behaviour_weight_cap=float(self.cfg.behaviour_weight_cap) if decoupled else None,
        agg=str(self.cfg.loss_agg), ref_logp_tok=batch.get("ref_logp"), kl_coef=float(self.cfg.kl_coef),
        norm_len=self.norm_len)
    return loss, aux

  def update(self, rows: list[dict], lagged: bool, seed: int) -> dict:
    """`grpo.epochs` passes of minibatches (`grpo.train.batch_size` rows; the last filled from the start of the
    shuffled order) over `rows`; rows with a zero advantage carry no gradient and are left out. Returns the
    round's mean metrics."""
    rows = [r for r in rows if r["advantage"] != 0.0 and r["reply_ids"]]
    if not rows:
      return {"updates": 0, "samples": 0}
    size = self.minibatch
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(int(self.cfg.epochs)):
      order = rng.permutation(len(rows))
      n = math.ceil(len(order) / size) * size
      order = np.resize(order, n)
      batches += [order[i:i + size] for i in range(0, n, size)]
    length = _bucket(max(len(r["prompt_ids"]) + len(r["reply_ids"]) - 1 for r in rows))  # the longest step
    arrays = token_batch(rows, length, self.pad_id)
    model = self.ts.model()
    if self.reference is not None:
      arrays["ref_logp"] = self._scored(self.reference, arrays, size)
    if lagged:
      arrays["proximal_logp"] = self._scored(model, arrays, size)
    metrics: dict[str, list[float]] = {}
    index, count = jax.process_index(), jax.process_count()
    for idx in batches:
      batch = {k: v[process_rows(idx, index, count)] for k, v in arrays.items()}
      if self._step is None or self._step[1] != (length, tuple(sorted(batch))):
        fn, shard = build_train_step(self.ts, self._loss, self.schedule, self.mesh, batch, wrt=self.wrt)
        self._step = ((fn, shard), (length, tuple(sorted(batch))))
      (fn, shard), _ = self._step
      self.rng, key = jax.random.split(self.rng)
      with jax.set_mesh(self.mesh):
        placed = put_batch(batch, shard)
        self.ts.state, out = fn(self.ts.state, placed, key)
      for k, v in jax.device_get(out).items():
        metrics.setdefault(k, []).append(float(v))
      metrics.setdefault("batch_rows", []).append(placed["advantage"].shape[0])  # the global batch: all processes'
    summary = {k: float(np.mean(v)) for k, v in metrics.items()}
    if not np.isfinite(summary.get("loss", 0.0)):
      raise FloatingPointError(f"grpo: the loss is {summary['loss']} in round {self.round + 1}; lower grpo.optim.lr")
    summary.update(updates=len(batches), samples=len(rows))
    return summary

  def _scored(self, model, arrays: dict, size: int) -> np.ndarray:
    """log π(target) of every row under `model` (on the learner's mesh), in minibatches of `size` rows split over
    the processes as the updates are (the last one filled from the start); every process gets all rows."""
    n, index, count = len(arrays["input_ids"]), jax.process_index(), jax.process_count()
    out = []
    for i in range(0, n, size):
      idx = process_rows(np.resize(np.arange(i, min(i + size, n)), size), index, count)
      chunk = {k: arrays[k][idx] for k in ("input_ids", "attention_mask", "targets")}
      with jax.set_mesh(self.mesh):
        logp = self._score(model, put_batch(chunk, batch_shardings(chunk, self.mesh)))
      out.append(_gathered(logp)[:min(size, n - i)])
    return np.concatenate(out) * arrays["loss_mask"]

  def end_round(self, round_index: int, metrics: dict, force: bool = False) -> None:
    self.round = round_index
    self.writer.write_scalars(round_index, {f"grpo/{k}": v for k, v in metrics.items()
                                            if isinstance(v, (int, float))})
    self.ckpt.save(round_index, self.ts.state, self.rng, {"round": round_index}, force=force)

  def close(self) -> None:
    self.ckpt.close()
    self.writer.close()
