"""WebRL's double critic over frozen trunk features (`proj/webrl/critic.py`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxagent.proj.webrl import critic
from jaxagent.rl import losses


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _ce(logits, y):
  lp = _log_softmax(logits)
  return -np.mean((1 - y) * lp[:, 0] + y * lp[:, 1])


def test_in_band_keeps_either_head_within_the_closed_band():
  p1 = np.array([0.05, 0.75, 0.04999, 0.7501, 0.0, 0.9, 0.3])
  p2 = np.array([0.0, 1.0, 0.0, 1.0, 0.05, 0.7501, 0.3])
  np.testing.assert_array_equal(critic.in_band(p1, p2), [True, True, False, False, True, False, True])
  np.testing.assert_array_equal(critic.in_band(p1, p1, band=(0.3, 0.3)), [False] * 6 + [True])


def test_the_heads_first_layers_are_drawn_from_n_0_0_2_with_zero_bias():
  model = critic.Critic(256, seed=0)
  for head in (model.head1, model.head2):
    for layer in (head.l0, head.l2):
      kernel = np.asarray(layer.kernel.get_value())
      assert kernel.shape == (256, 256)
      assert abs(kernel.std() - 0.2) < 0.02
      assert abs(kernel.mean()) < 0.01
      np.testing.assert_array_equal(np.asarray(layer.bias.get_value()), 0.0)
    assert head.l4.kernel.get_value().shape == (256, 2)
  assert not np.allclose(model.head1.l0.kernel.get_value(), model.head2.l0.kernel.get_value())


def _batch(d=6, n=5, seed=0):
  rng = np.random.default_rng(seed)
  return {"state": rng.normal(size=(n, d)).astype(np.float32), "next_state": rng.normal(size=(n, d)).astype(np.float32),
          "label": np.array([1, 0, 1, 1, 0], np.float32)[:n]}


def test_critic_loss_is_both_heads_ce_at_s_and_s_next_to_the_label_of_s():
  model, batch = critic.Critic(6, seed=1), _batch()
  loss, metrics = critic.critic_loss(model, {k: jnp.asarray(v) for k, v in batch.items()})
  h1, h2 = (np.asarray(h) for h in model(jnp.asarray(batch["state"])))
  n1, n2 = (np.asarray(h) for h in model(jnp.asarray(batch["next_state"])))
  y = batch["label"]
  by_hand = _ce(h1, y) + _ce(h2, y) + _ce(n1, y) + _ce(n2, y)
  np.testing.assert_allclose(float(loss), by_hand, rtol=1e-5)
  ref = losses.value_ce_double(h1, h2, y) + losses.value_ce_double(n1, n2, y)
  np.testing.assert_allclose(float(loss), float(ref), rtol=1e-6)
  np.testing.assert_allclose(float(metrics["accuracy"]), np.mean(h1.argmax(-1) == y), atol=1e-7)


def test_values_are_the_min_of_the_heads_success_probabilities():
  model, feats = critic.Critic(6, seed=2), _batch(seed=3)["state"]
  h1, h2 = (np.asarray(h, np.float64) for h in model(jnp.asarray(feats)))
  s1, s2 = np.exp(_log_softmax(h1))[:, 1], np.exp(_log_softmax(h2))[:, 1]
  p1, p2 = critic.head_probs(model, feats)
  np.testing.assert_allclose(p1, s1, atol=1e-6)
  np.testing.assert_allclose(p2, s2, atol=1e-6)
  np.testing.assert_allclose(critic.values(model, feats), np.minimum(s1, s2), atol=1e-6)
  assert not np.allclose(s1, s2)  # the min is not trivially either head


def _config(steps):
  from jaxagent import config_lib
  from jaxagent.pipeline.config import stage_config
  c = config_lib.base_config(staged=True)
  c.recipe = "webrl"
  c.train.progress_bar = False
  c.checkpoint.async_save = False
  c.checkpoint.every = 10**6
  c.critic = config_lib.stage(steps=steps, batch_size=16, lr=3e-3, warmup_steps=0, end_lr_ratio=1.0)
  return stage_config(c, c.critic)


@pytest.mark.slow
def test_train_separates_a_toy_problem_and_restores(tmp_path):
  rng = np.random.default_rng(0)
  n, d = 128, 16
  label = (np.arange(n) % 2).astype(bool)
  state = rng.normal(size=(n, d)).astype(np.float32) + label[:, None]
  next_state = state + 0.1 * rng.normal(size=(n, d)).astype(np.float32)
  before = critic.values(critic.Critic(d, 0), state)
  assert np.mean((before >= 0.5) == label) < 0.8  # not separated at init
  config = _config(60)
  model = critic.train(config, str(tmp_path / "critic"), state, next_state, label)
  v = critic.values(model, state)
  assert np.mean((v >= 0.5) == label) > 0.9
  restored = critic.restore(config, str(tmp_path / "critic"), d)
  np.testing.assert_allclose(critic.values(restored, state), v, atol=1e-6)
  for a, b in zip(jax.tree.leaves(nnx.state(restored, nnx.Param)), jax.tree.leaves(nnx.state(model, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_advantages_are_webrl_advantage_code_over_the_phase_rows_then_the_replay(monkeypatch, tmp_path):
  """The actor's advantages equal the recipe's former inline `clip(V(s') − V(s) − 0.05 + r + G, −1, 1)`."""
  rng = np.random.default_rng(1)
  d, now, replayed = 8, 5, 3
  feats = rng.normal(size=(2 * (now + replayed), d)).astype(np.float32) * 3  # the states, then the next states
  (tmp_path / "phase2" / "critic").mkdir(parents=True)
  np.save(tmp_path / "phase2" / "critic" / "state_feats.npy", feats)
  model = critic.Critic(d, 0)
  seen = []
  monkeypatch.setattr(critic, "restore", lambda config, workdir, dim: seen.append((workdir, dim)) or model)
  monkeypatch.setattr(critic, "phase_config", lambda config, t: None)
  rows = {"reward": np.array([0, 0, 0, 0, 1], np.float32), "mc_return": np.array([0, 0, 0, 0.5, 2], np.float32)}
  history = {"reward": np.ones(replayed, np.float32), "mc_return": np.full(replayed, 2.71, np.float32)}
  adv = critic.advantages(None, str(tmp_path), 2, rows, history)
  assert seen == [(str(tmp_path / "phase2" / "critic"), d)]
  v, v_next = critic.values(model, feats[:now + replayed]), critic.values(model, feats[now + replayed:])
  reward = np.concatenate([rows["reward"], history["reward"]])
  mc = np.concatenate([rows["mc_return"], history["mc_return"]])
  np.testing.assert_array_equal(adv, np.clip(v_next - v - 0.05 + reward + mc, -1.0, 1.0))
  assert adv.dtype == np.float32 and adv.max() == 1.0 and (np.abs(adv[:3]) < 1).all()  # clipped and not
