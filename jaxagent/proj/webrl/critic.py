"""WebRL's critic (§3.7; `webrl/models/critic.py:VLMDoubleCritic`, `webrl/algorithms/webrl/trainer.py`).

A state's features are the SFT model's final hidden state at the prompt's last token (the code's
`base_lm(obs)[0][:, -1]`, with `critic_lm` the SFT checkpoint in every phase); two heads MLP(d → d → d → 2)
with ReLU read them, the first two layers drawn from N(0, 0.2²) with zero bias as the code initialises them.
V(s) = min over the heads of softmax[1]; the action is not an input. Loss: CE(h1(s), y) + CE(h2(s), y) +
CE(h1(s'), y) + CE(h2(s'), y) with y = 1[G_t > 0] (`critic_loss`). The trunk is frozen here (features computed
once per state); the code back-propagates into it at lr 1e-6.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent.data import pipeline
from jaxagent.rl import losses
from jaxagent.train import loop

INIT_STD = 0.2  # initializer_range
FILTER = (0.05, 0.75)  # gen_task.py:filter_by_critic's thresholds


class _Head(nnx.Module):
  def __init__(self, d: int, rngs: nnx.Rngs):
    init = nnx.initializers.normal(INIT_STD)
    self.l0 = nnx.Linear(d, d, kernel_init=init, rngs=rngs)
    self.l2 = nnx.Linear(d, d, kernel_init=init, rngs=rngs)
    self.l4 = nnx.Linear(d, 2, rngs=rngs)

  def __call__(self, x):
    return self.l4(jax.nn.relu(self.l2(jax.nn.relu(self.l0(x)))))


class Critic(nnx.Module):
  """The double value head over `d`-dimensional trunk features."""

  def __init__(self, d: int, seed: int):
    rngs = nnx.Rngs(seed)
    self.head1, self.head2 = _Head(d, rngs), _Head(d, rngs)

  def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    x = x.astype(jnp.float32)
    return self.head1(x), self.head2(x)


def critic_loss(model: Critic, batch, rng=None):
  """`trainer.py:critic_loss`: both heads at s and at s' to the label of s."""
  del rng
  h1, h2 = model(batch["state"])
  n1, n2 = model(batch["next_state"])
  y = batch["label"]
  acc = jnp.mean((jnp.argmax(h1, -1) == y).astype(jnp.float32))
  return losses.value_ce_double(h1, h2, y) + losses.value_ce_double(n1, n2, y), {"accuracy": acc}


def train(config, workdir: str, state: np.ndarray, next_state: np.ndarray, label: np.ndarray,
          start: Critic | None = None) -> Critic:
  """The critic trained on feature rows for `config.train.steps` (a `stage_config`), continuing `start` (the
  previous phase's critic, as `critic_resume_path` does) when given."""
  rows = {"state": state.astype(np.float32), "next_state": next_state.astype(np.float32),
          "label": label.astype(np.float32)}
  ds = pipeline.rows_dataset(rows, batch_size=int(config.train.batch_size), seed=int(config.seed))
  model_fn = lambda: Critic(state.shape[-1], int(config.seed))  # noqa: E731
  pretrained = None
  if start is not None:
    graphdef, params = nnx.split(start)
    pretrained = lambda: nnx.merge(graphdef, jax.device_get(params))  # noqa: E731
  loop.train(config, workdir, model_fn=model_fn, loss_fn=critic_loss, dataset=ds, pretrained=pretrained)
  return loop.restore_model(config, workdir, model_fn)


def restore(config, workdir: str, dim: int) -> Critic:
  return loop.restore_model(config, workdir, lambda: Critic(dim, int(config.seed)))


def head_probs(model: Critic, feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(softmax(h1)[1], softmax(h2)[1]) per row."""
  h1, h2 = nnx.jit(lambda m, x: m(x))(model, jnp.asarray(feats, jnp.float32))
  return np.asarray(jax.nn.softmax(h1, -1)[:, 1]), np.asarray(jax.nn.softmax(h2, -1)[:, 1])


def values(model: Critic, feats: np.ndarray) -> np.ndarray:
  """V(s) = min(softmax(h1)[1], softmax(h2)[1]) (`trainer.py:actor_loss`)."""
  return np.minimum(*head_probs(model, feats))


def in_band(p1: np.ndarray, p2: np.ndarray, band: tuple[float, float] = FILTER) -> np.ndarray:
  """`filter_by_critic`'s test: either head's success probability within [lo, hi] (bounds included)."""
  lo, hi = band
  return ((lo <= p1) & (p1 <= hi)) | ((lo <= p2) & (p2 <= hi))
