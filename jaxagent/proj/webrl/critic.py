"""WebRL's critic (§3.7; `webrl/models/critic.py:VLMDoubleCritic`, `webrl/algorithms/webrl/trainer.py`).

A state's features are the SFT model's final hidden state at the prompt's last token (the code's
`base_lm(obs)[0][:, -1]`, with `critic_lm` the SFT checkpoint in every phase); two heads MLP(d → d → d → 2)
with ReLU read them, the first two layers drawn from N(0, 0.2²) with zero bias as the code initialises them.
V(s) = min over the heads of softmax[1]; the action is not an input. Loss: CE(h1(s), y) + CE(h2(s), y) +
CE(h1(s'), y) + CE(h2(s'), y) with y = 1[G_t > 0] (`critic_loss`). The trunk is frozen here (features computed
once per state); the code back-propagates into it at lr 1e-6. Phase t's critic continues phase t−1's
(`critic_resume_path`) and gives the actor's advantages `rl.losses.webrl_advantage_code`.
"""

from __future__ import annotations

import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent.agents.webrl import current_html
from jaxagent.data import pipeline
from jaxagent.pipeline import distributed, scoring
from jaxagent.pipeline.config import stage_config
from jaxagent.pipeline.policy import inference_mesh
from jaxagent.proj.webrl import data
from jaxagent.rl import losses
from jaxagent.serving.checkpoint import load_policy
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


# ------------------------------------------------------------------------------------ a phase's critic


def features(config, workdir: str, prompts: Sequence[str], cache: str) -> np.ndarray:
  """[N, D] the SFT trunk's state at each prompt's last token (each distinct prompt read once), cached in
  `cache` (.npy)."""
  if os.path.exists(cache):
    return np.load(cache)
  distinct = sorted(set(prompts))
  items = [data.sample(str(i), p, "x") for i, p in enumerate(distinct)]
  trunk = load_policy(os.path.join(workdir, "sft"), mesh=inference_mesh(config))
  feats = scoring.score(trunk, items, **data.score_options(config))["hidden"]
  row = {p: i for i, p in enumerate(distinct)}
  feats = feats[[row[p] for p in prompts]]
  if distributed.is_main():  # every process computed the same features; one writes them
    np.save(f"{cache}.tmp{os.getpid()}.npy", feats)
    os.replace(f"{cache}.tmp{os.getpid()}.npy", cache)
  return feats


def phase_config(config, t: int):
  """Phase t's critic training config (`config.critic`, its own seed)."""
  return stage_config(config, config.critic, seed_offset=20 + t)


def previous(config, workdir: str, t: int, dim: int) -> Critic | None:
  """Phase t−1's critic, which phase t's continues and filters phase t's curriculum; none before phase 2."""
  if t == 1:
    return None
  return restore(phase_config(config, t - 1), os.path.join(workdir, f"phase{t - 1}", "critic"), dim)


def train_phase(config, workdir: str, t: int, rows: dict, history: dict, out: str) -> dict:
  """Phase t's critic (`out`) on this phase's step rows and the replay's (label 1[G_t > 0]), continuing phase
  t−1's; the states' features (the states, then the next states) kept in `out/state_feats.npy` for
  `advantages`. Returns its summary."""
  states = rows["state"] + history["state"]
  both = features(config, workdir, states + rows["next_state"] + history["next_state"],
                  os.path.join(out, "state_feats.npy"))
  feats, nfeats = both[:len(states)], both[len(states):]
  label = np.concatenate([rows["mc_return"], history["mc_return"]]) > 0
  model = train(phase_config(config, t), out, feats, nfeats, label, previous(config, workdir, t, feats.shape[-1]))
  v = values(model, feats)
  return {"rows": int(len(label)), "positive": float(label.mean()) if len(label) else 0.0,
          "v_success": float(v[label].mean()) if label.any() else None,
          "v_failure": float(v[~label].mean()) if (~label).any() else None}


def start_pages(workdir: str) -> dict[str, str]:
  """Each site's start page as the demonstrations first saw it (the critic filter's canonical HTML, as the
  original's `htmls.json`)."""
  pages = {}
  for t in data.demos(workdir):
    if t.steps and t.task.site not in pages:
      pages[t.task.site] = current_html(t.steps[0].obs_text)
  return pages


def advantages(config, workdir: str, t: int, rows: dict, history: dict) -> np.ndarray:
  """Each step's A = clamp(V(s') − V(s) − 0.05 + r + G_t, −1, 1) under phase t's critic, on the rows `train_phase`
  trained it on (this phase's, then the replay's)."""
  critic_dir = os.path.join(workdir, f"phase{t}", "critic")
  feats, nfeats = np.split(np.load(os.path.join(critic_dir, "state_feats.npy")), 2)
  model = restore(phase_config(config, t), critic_dir, feats.shape[-1])
  reward = np.concatenate([rows["reward"], history["reward"]])
  mc_return = np.concatenate([rows["mc_return"], history["mc_return"]])
  return np.asarray(losses.webrl_advantage_code(values(model, feats), values(model, nfeats), reward, mc_return))
