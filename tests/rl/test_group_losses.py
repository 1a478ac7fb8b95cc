"""Group-relative policy optimisation's losses (GRPO, Dr. GRPO, GiGPO, PPO-clip, k3, decoupled PPO) against
hand-computed values."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.rl import losses as L


def test_grpo_advantages_normalise_within_each_group_with_the_unbiased_std():
  r = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
  ids = jnp.array([0, 0, 0, 1, 1, 2])  # group 2 is a single rollout
  adv = np.asarray(L.grpo_advantages(r, ids, 3))
  # group 0: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
  s = math.sqrt(1 / 3)
  np.testing.assert_allclose(adv[:3], [(2 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6)],
                             rtol=1e-5)
  np.testing.assert_allclose(adv[3:5], [0.0, 0.0], atol=1e-6)  # equal returns: no signal
  np.testing.assert_allclose(adv[5], 0.0 / (1.0 + 1e-6), atol=1e-6)  # a group of one: mean 0, std 1 -> R itself
  assert L.grpo_advantages(jnp.array([0.5]), jnp.array([0]), 1)[0] == pytest.approx(0.5 / (1 + 1e-6))


def test_dr_grpo_only_centres():
  adv = L.grpo_advantages(jnp.array([1.0, 0.0, 0.0, 0.0]), jnp.array([0, 0, 0, 0]), 1, scale="none")
  np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25], rtol=1e-6)
  with pytest.raises(ValueError, match="scale"):
    L.grpo_advantages(jnp.zeros(2), jnp.zeros(2, int), 1, scale="mad")


def test_gigpo_groups_steps_by_anchor_state_and_adds_the_episode_advantage():
  # two rollouts from the same reset: step 0 shares its state (anchor 0); step 1 differs (anchors 1, 2)
  step_returns = jnp.array([0.95, 1.0, 0.0, 0.0])  # rollout 0: steps (s0, s1), rollout 1: steps (s0, s2)
  anchors = jnp.array([0, 1, 0, 2])
  step_adv = np.asarray(L.gigpo_step_advantages(step_returns, anchors, 3))
  np.testing.assert_allclose(step_adv, [0.475, 1.0, -0.475, 0.0], rtol=1e-6)  # singletons keep R - 0
  ep = L.grpo_advantages(jnp.array([1.0, 0.0]), jnp.array([0, 0]), 1)
  s = math.sqrt(0.5)
  np.testing.assert_allclose(ep, [0.5 / (s + 1e-6), -0.5 / (s + 1e-6)], rtol=1e-5)
  total = L.gigpo_advantages(jnp.repeat(ep, 2), step_adv, step_weight=0.5)
  np.testing.assert_allclose(total, np.repeat(np.asarray(ep), 2) + 0.5 * step_adv, rtol=1e-6)


def test_k3_is_the_closed_form_and_never_negative():
  logp, ref = jnp.log(jnp.array([0.5, 0.2])), jnp.log(jnp.array([0.25, 0.2]))
  q = math.log(0.25) - math.log(0.5)
  np.testing.assert_allclose(L.k3_kl(logp, ref), [math.exp(q) - q - 1, 0.0], atol=1e-7)
  x = jax.random.normal(jax.random.key(0), (2, 100)) * 3
  assert float(jnp.min(L.k3_kl(x[0], x[1]))) >= 0.0


def test_token_aggregations_by_hand():
  x = jnp.array([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
  m = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0]])
  assert float(L.aggregate_tokens(x, m, "token_mean")) == pytest.approx(10 / 4)
  assert float(L.aggregate_tokens(x, m, "seq_mean_token_mean")) == pytest.approx((2 + 4) / 2)
  assert float(L.aggregate_tokens(x, m, "seq_mean_token_sum_norm", norm_len=10)) == pytest.approx(0.5)
  padded = jnp.pad(x, ((0, 0), (0, 60))), jnp.pad(m, ((0, 0), (0, 60)))  # the same rows in a longer batch
  assert float(L.aggregate_tokens(*padded, "seq_mean_token_sum_norm", norm_len=10)) == pytest.approx(0.5)
  with pytest.raises(ValueError, match="norm_len"):  # Dr. GRPO's constant, never the batch's padded length
    L.aggregate_tokens(x, m, "seq_mean_token_sum_norm")


@pytest.mark.slow
def test_ppo_clip_by_hand_and_its_gradient_vanishes_where_clipped():
  old = jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.5]]))
  new = jnp.log(jnp.array([[0.75, 0.55], [0.25, 0.5]]))  # ratios 1.5, 1.1 | 0.5, 1.0
  adv = jnp.array([1.0, -1.0])
  m = jnp.ones((2, 2))
  loss, aux = L.ppo_clip_loss(new, old, adv, m, 0.2, 0.2)
  # row 0 (A=+1): -min(1.5, 1.2) = -1.2, -min(1.1, 1.1) = -1.1; row 1 (A=-1): -min(-0.5, -0.8) = 0.8, -(-1.0) = 1.0
  assert float(loss) == pytest.approx((-1.2 - 1.1 + 0.8 + 1.0) / 4, rel=1e-5)
  assert float(aux["clip_fraction"]) == pytest.approx(2 / 4)
  g = jax.grad(lambda lp: L.ppo_clip_loss(lp, old, adv, m, 0.2, 0.2)[0])(new)
  np.testing.assert_allclose(g[0, 0], 0.0)  # clipped above with A > 0
  np.testing.assert_allclose(g[1, 0], 0.0)  # clipped below with A < 0
  np.testing.assert_allclose(g[0, 1], -1.1 / 4, rtol=1e-5)  # d(-ρA)/dlogp = -ρA, / 4 tokens
  # asymmetric clip (DAPO's clip-higher): 1.5 is clipped at 1.28 instead
  loss_hi, _ = L.ppo_clip_loss(new, old, adv, m, 0.2, 0.28)
  assert float(loss_hi) == pytest.approx((-1.28 - 1.1 + 0.8 + 1.0) / 4, rel=1e-5)


def test_ppo_kl_term_and_masking():
  old = jnp.log(jnp.full((1, 3), 0.5))
  new = jnp.log(jnp.array([[0.5, 0.5, 0.9]]))
  ref = jnp.log(jnp.array([[0.25, 0.5, 0.1]]))
  m = jnp.array([[1, 1, 0]])  # the third token is padding: its huge ratio and KL never count
  loss, aux = L.ppo_clip_loss(new, old, jnp.array([2.0]), m, ref_logp_tok=ref, kl_coef=0.1)
  q = math.log(0.25 / 0.5)
  kl0 = math.exp(q) - q - 1
  assert float(loss) == pytest.approx((-2.0 - 2.0 + 0.1 * kl0) / 2, rel=1e-5)
  assert float(aux["kl"]) == pytest.approx(kl0 / 2, rel=1e-5)


def test_decoupled_ppo_weights_tokens_by_proximal_over_behaviour_and_drops_those_over_the_cap():
  behav = jnp.log(jnp.array([[0.5, 0.1]]))
  prox = jnp.log(jnp.array([[0.5, 0.5]]))  # w = 1 and 5
  new = prox
  loss, _ = L.ppo_clip_loss(new, prox, jnp.array([1.0]), jnp.ones((1, 2)), behaviour_logp_tok=behav)
  assert float(loss) == pytest.approx((-1.0 - 5.0) / 2, rel=1e-5)
  capped, _ = L.ppo_clip_loss(new, prox, jnp.array([1.0]), jnp.ones((1, 2)), behaviour_logp_tok=behav,
                              behaviour_weight_cap=2.0)
  assert float(capped) == pytest.approx(-1.0, rel=1e-5)
  same, _ = L.ppo_clip_loss(new, prox, jnp.array([1.0]), jnp.ones((1, 2)), behaviour_logp_tok=prox)
  plain, _ = L.ppo_clip_loss(new, prox, jnp.array([1.0]), jnp.ones((1, 2)))
  assert float(same) == pytest.approx(float(plain))  # lag 0: decoupled PPO is PPO
