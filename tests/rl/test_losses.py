"""The RL loss library against hand-computed values and direct numpy transcriptions of the originals."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.rl import losses as L


def _np(x):
  return np.asarray(x, np.float64)


# ------------------------------------------------------------------------------------------- Digi-Q


def test_digiq_td_targets_hand_computed():
  r = jnp.array([0.0, 1.0, 0.0])
  done = jnp.array([0.0, 1.0, 0.0])
  vbar1 = jnp.array([0.5, 0.9, 0.2])
  vbar2 = jnp.array([0.4, 0.8, 0.1])
  qbar1 = jnp.array([0.3, 0.7, 0.6])
  qbar2 = jnp.array([0.2, 0.5, 0.9])
  (yq1, yq2), (yv1, yv2) = L.digiq_td_targets(r, done, 0.95, qbar1, qbar2, vbar1, vbar2)
  # y_Q = r + (1 - done) * 0.95 * vbar': 0 + 0.95*0.5, terminal -> r, 0 + 0.95*0.2
  np.testing.assert_allclose(yq1, [0.475, 1.0, 0.19], rtol=1e-6)
  np.testing.assert_allclose(yq2, [0.38, 1.0, 0.095], rtol=1e-6)
  # y_V = qbar (head-paired: V1 on Q̄1, V2 on Q̄2)
  np.testing.assert_allclose(yv1, [0.3, 0.7, 0.6])
  np.testing.assert_allclose(yv2, [0.2, 0.5, 0.9])


def test_digiq_td_targets_stop_gradient():
  def f(vbar, qbar):
    (yq1, yq2), (yv1, yv2) = L.digiq_td_targets(jnp.zeros(2), jnp.zeros(2), 0.95, qbar, qbar, vbar, vbar)
    return jnp.sum(yq1 + yq2 + yv1 + yv2)

  g_v, g_q = jax.grad(f, argnums=(0, 1))(jnp.ones(2), jnp.ones(2))
  np.testing.assert_array_equal(g_v, 0.0)
  np.testing.assert_array_equal(g_q, 0.0)


def test_digiq_critic_loss_regression_hand_computed():
  y_q = (jnp.array([0.475, 1.0, 0.19]), jnp.array([0.38, 1.0, 0.095]))
  y_v = (jnp.array([0.3, 0.7, 0.6]), jnp.array([0.2, 0.5, 0.9]))
  q1 = jnp.array([[0.575], [1.0], [-0.01]])  # errors 0.1, 0, -0.2 -> MSE (0.01 + 0.04) / 3
  q2 = jnp.array([0.38, 1.0, 0.095])  # exact -> 0
  v1 = jnp.array([[0.3], [0.7], [0.9]])  # error 0.3 -> 0.09 / 3
  v2 = jnp.array([[0.0], [0.5], [0.9]])  # error -0.2 -> 0.04 / 3
  loss, parts = L.digiq_critic_loss(q1, q2, v1, v2, y_q, y_v, "regression")
  np.testing.assert_allclose(parts["q1_loss"], 0.05 / 3, rtol=1e-5)
  np.testing.assert_allclose(parts["q2_loss"], 0.0, atol=1e-12)
  np.testing.assert_allclose(parts["v1_loss"], 0.03, rtol=1e-5)
  np.testing.assert_allclose(parts["v2_loss"], 0.04 / 3, rtol=1e-5)
  np.testing.assert_allclose(loss, 0.05 / 3 + 0.03 + 0.04 / 3, rtol=1e-5)


def test_digiq_critic_loss_classification_soft_labels():
  logits = jnp.array([[0.0, 0.0], [2.0, -1.0]])
  y = jnp.array([0.25, 1.0])
  loss, parts = L.digiq_critic_loss(logits, logits, logits, logits, (y, y), (y, y), "classification")
  # row 0: uniform softmax -> CE = ln 2 whatever y; row 1: -log softmax[1] = log(1 + e^3)
  expected = (math.log(2.0) + math.log1p(math.exp(3.0))) / 2
  np.testing.assert_allclose(parts["q1_loss"], expected, rtol=1e-5)
  np.testing.assert_allclose(loss, 4 * expected, rtol=1e-5)


def test_digiq_mc_targets():
  g = jnp.array([0.0, 0.9025, 0.0, 1.0])
  np.testing.assert_allclose(L.digiq_mc_targets(g, "regression"), g)
  np.testing.assert_array_equal(L.digiq_mc_targets(g, "classification"), [0, 1, 0, 1])


def test_digiq_backup_qbar_modes():
  qbar = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 9.0]])
  np.testing.assert_array_equal(L.digiq_backup_qbar(qbar, "dataset"), [1.0, 4.0])
  np.testing.assert_allclose(L.digiq_backup_qbar(qbar, "mean"), [2.0, 6.0])
  seen = set()
  for seed in range(12):
    out = np.asarray(L.digiq_backup_qbar(qbar, "sample", jax.random.key(seed)))
    col = int(np.where(qbar[0] == out[0])[0][0])
    assert out[1] == qbar[1, col]  # one index shared by the batch, as the code's random.choice
    seen.add(col)
  assert len(seen) > 1
  with pytest.raises(ValueError, match="key"):
    L.digiq_backup_qbar(qbar, "sample")


def test_best_of_n_select_max_heads_hand_computed():
  q = jnp.array([[[0.2, 0.5], [0.9, 0.1], [0.3, 0.3]],
                 [[0.1, 0.0], [0.2, 0.4], [0.8, 0.9]]])
  v = jnp.array([[0.4, 0.6], [0.5, 0.2]])
  valid = jnp.array([[True, True, True], [True, True, False]])
  idx, adv = L.best_of_n_select(q, v, valid, head_reduce="max")
  # max over heads: q = [[.5,.9,.3],[.1,.4,.9]], v = [.6,.5]; Adv = [[-.1,.3,-.3],[-.4,-.1, 0 (invalid)]]
  np.testing.assert_array_equal(idx, [1, 2])  # row 2: the invalid candidate's 0 beats the negatives (as coded)
  np.testing.assert_allclose(adv, [0.3, 0.0], atol=1e-6)


def test_best_of_n_select_min_heads_and_ties():
  q = jnp.array([[[0.2, 0.5], [0.9, 0.1], [0.3, 0.3]],
                 [[0.1, 0.0], [0.2, 0.4], [0.8, 0.9]]])
  v = jnp.array([[0.4, 0.6], [0.5, 0.2]])
  valid = jnp.array([[True, True, True], [True, True, False]])
  idx, adv = L.best_of_n_select(q, v, valid, head_reduce="min")
  # min over heads: q = [[.2,.1,.3],[.0,.2,.8]], v = [.4,.2]; Adv = [[-.2,-.3,-.1],[-.2, 0, 0]] -> first max
  np.testing.assert_array_equal(idx, [2, 1])
  np.testing.assert_allclose(adv, [-0.1, 0.0], atol=1e-6)


def test_best_of_n_select_exclude_dataset_action():
  q = jnp.array([[1.0, 0.5, 0.2]])
  v = jnp.array([0.0])
  valid = jnp.ones((1, 3), bool)
  assert L.best_of_n_select(q, v, valid)[0].tolist() == [0]
  idx, adv = L.best_of_n_select(q, v, valid, include_index0=False)
  assert idx.tolist() == [1]
  np.testing.assert_allclose(adv, [0.5])


def test_best_of_n_select_rejects_bad_shapes():
  with pytest.raises(ValueError, match="valid"):
    L.best_of_n_select(jnp.zeros((2, 3)), jnp.zeros(2), jnp.ones((2, 4), bool))


def test_best_of_n_weights_hand_computed():
  adv = jnp.array([-0.2, 0.05, 0.1, 0.3, 1.7])  # clamp -> [0, .05, .1, .3, 1]
  np.testing.assert_array_equal(L.best_of_n_weights(adv, "best-of-n", threshold=0.10), [0, 0, 0, 1, 1])
  np.testing.assert_array_equal(L.best_of_n_weights(adv, "best-of-n", threshold=0.05), [0, 0, 1, 1, 1])
  np.testing.assert_allclose(L.best_of_n_weights(adv, "pg", pg_multiplier=5.0), [0, 0.25, 0.5, 1.5, 5.0],
                             rtol=1e-6)
  np.testing.assert_allclose(L.best_of_n_weights(adv, "awr", awr_beta=0.5),
                             np.exp([0, 0.1, 0.2, 0.6, 2.0]), rtol=1e-6)
  np.testing.assert_array_equal(L.best_of_n_weights(adv, "sft"), [1, 1, 1, 1, 1])
  with pytest.raises(ValueError, match="kind"):
    L.best_of_n_weights(adv, "ppo")


def test_best_of_n_candidate_ids():
  for seed in range(5):
    ids = np.asarray(L.best_of_n_candidate_ids(jax.random.key(seed), 16, 8))
    assert ids.shape == (8,) and ids[0] == 0 and ids.min() >= 0 and ids.max() < 16
    assert len(set(ids[1:].tolist())) == 7  # sampled without replacement
  ids = np.asarray(L.best_of_n_candidate_ids(jax.random.key(0), 16, 16, include_index0=False))
  assert sorted(ids.tolist()) == list(range(16))
  with pytest.raises(ValueError, match="n_stored"):
    L.best_of_n_candidate_ids(jax.random.key(0), 4, 8)


# ----------------------------------------------------------------------------------------- BC / NLL


@pytest.mark.slow
def test_bc_nll_clamp_and_normalisation_hand_computed():
  p = np.array([[0.5, 0.0005, 0.3], [0.995, 0.2, 0.1]])
  mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
  w = jnp.array([1.0, 2.0])
  logp = jnp.log(jnp.asarray(p, jnp.float32))
  raw = [math.log(0.5) + math.log(0.0005), math.log(0.995) + math.log(0.2) + math.log(0.1)]
  np.testing.assert_allclose(L.bc_nll(logp, mask, w), -(raw[0] + 2 * raw[1]) / 2, rtol=1e-5)
  clamped = [math.log(0.5) + math.log(0.001), math.log(0.99) + math.log(0.2) + math.log(0.1)]
  np.testing.assert_allclose(L.bc_nll(logp, mask, w, clamp_prob=L.AUTOUI_PROB_CLAMP),
                             -(clamped[0] + 2 * clamped[1]) / 2, rtol=1e-5)
  np.testing.assert_allclose(L.bc_nll(logp, mask, w, normalize="token"), -(raw[0] + 2 * raw[1]) / 5, rtol=1e-5)
  # clamped tokens carry no gradient (torch.clamp semantics); the padded token none either
  g = jax.grad(lambda lp: L.bc_nll(lp, mask, w, clamp_prob=L.AUTOUI_PROB_CLAMP))(logp)
  assert g[0, 1] == 0 and g[0, 2] == 0 and g[1, 0] == 0
  np.testing.assert_allclose(g[1, 1], -1.0, rtol=1e-5)  # d/dlogp of -(2 * logp)/2
  # padding may hold -inf (log 0): it must neither poison the loss nor its gradient
  padded = logp.at[0, 2].set(-jnp.inf)
  np.testing.assert_allclose(L.bc_nll(padded, mask, w), L.bc_nll(logp, mask, w), rtol=1e-6)
  assert bool(jnp.all(jnp.isfinite(jax.grad(lambda lp: L.bc_nll(lp, mask, w))(padded))))


# ------------------------------------------------------------------------------------------- DigiRL


def _np_digirl_actor_loss(l1, l2, nl1, nl2, r, g, logp_tok, mask):
  """numpy transcription of `digirl/algorithms/digirl/trainer.py:actor_loss` + `get_log_prob` (§4.4, §4.7)."""
  sm = lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True)
  v = np.minimum(sm(l1)[:, 1], sm(l2)[:, 1])
  nv = np.minimum(sm(nl1)[:, 1], sm(nl2)[:, 1])
  advantage = nv - v - 0.05 + r + g
  advantage = np.clip(advantage, 0, 1)
  advantage = (advantage > 0).astype(np.float64)
  log_prob = (np.log(np.clip(np.exp(logp_tok), 0.001, 0.99)) * mask).sum(1)
  return -np.mean(log_prob * advantage)


def test_digirl_actor_loss_matches_numpy_transcription():
  rng = np.random.default_rng(0)
  b, t = 6, 5
  l1, l2, nl1, nl2 = (rng.normal(size=(b, 2)) for _ in range(4))
  r = np.array([0, 0, 1, 0, 0, 1.0])
  g = np.array([0, 0.125, 1, 0, 0.5, 1.0])
  logp_tok = np.log(rng.uniform(0.0002, 1.0, size=(b, t)))
  mask = (np.arange(t)[None] < rng.integers(1, t + 1, size=(b, 1))).astype(np.float64)
  v = L.double_value_prob(jnp.asarray(l1), jnp.asarray(l2), "min")
  nv = L.double_value_prob(jnp.asarray(nl1), jnp.asarray(nl2), "min")
  w = L.digirl_weights_code(L.digirl_advantage_code(v, nv, r, g))
  ours = L.bc_nll(jnp.asarray(logp_tok, jnp.float32), mask, w, clamp_prob=L.AUTOUI_PROB_CLAMP)
  np.testing.assert_allclose(ours, _np_digirl_actor_loss(l1, l2, nl1, nl2, r, g, logp_tok, mask), rtol=1e-5)


def test_digirl_advantage_code_hand_computed():
  a = L.digirl_advantage_code(jnp.array([0.2, 0.5, 0.5]), jnp.array([0.3, 0.4, 0.5]),
                              jnp.array([0.0, 1.0, 0.0]), jnp.array([0.0, 1.0, 0.0]))
  np.testing.assert_allclose(a, [0.05, 1.85, -0.05], rtol=1e-5)  # v' - v - 0.05 + r + G
  np.testing.assert_array_equal(L.digirl_weights_code(a), [1, 1, 0])


def test_digirl_advantage_dr_hand_computed():
  # λ = 0.5, H = 10; h = 10 -> λ^0 = 1: A = r_H; h = 8 -> λ^2 = .25: A = .25 r_H + .75 (V' + r - V)
  a = L.digirl_advantage_dr(v=jnp.array([0.2, 0.4, 0.5]), v_next=jnp.array([0.3, 0.6, 0.5]),
                            r=jnp.zeros(3), r_final=jnp.array([1.0, 1.0, 0.0]), lam=0.5, horizon=10,
                            h=jnp.array([10, 8, 8]))
  np.testing.assert_allclose(a, [1.0, 0.25 + 0.75 * 0.2, 0.0], rtol=1e-5)
  np.testing.assert_array_equal(L.digirl_weights_dr(a, horizon=10), [1, 1, 0])


def test_value_ce_double_matches_numpy():
  rng = np.random.default_rng(1)
  l1, l2 = rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
  y = np.array([0, 1, 1, 0])
  ce = lambda l: -np.mean(np.log(np.exp(l[np.arange(4), y]) / np.exp(l).sum(-1)))
  np.testing.assert_allclose(L.value_ce_double(jnp.asarray(l1), jnp.asarray(l2), y), ce(l1) + ce(l2), rtol=1e-5)


def test_topk_quantile_filter_and_quirk():
  np.testing.assert_array_equal(L.topk_quantile_filter(jnp.arange(10.0)), [False] * 9 + [True])  # q.9 = 8.1
  two_of_ten = jnp.array([0.0] * 8 + [1.0, 1.0])  # 20% succeed: cutoff 1 -> successes only
  np.testing.assert_array_equal(L.topk_quantile_filter(two_of_ten), [False] * 8 + [True, True])
  one_of_twenty = jnp.array([0.0] * 19 + [1.0])  # 5% succeed: cutoff 0 -> everything kept (DigiRL quirk)
  assert bool(jnp.all(L.topk_quantile_filter(one_of_twenty)))
  np.testing.assert_array_equal(L.topk_quantile_filter(jnp.arange(10.0)),
                                np.arange(10.0) >= np.quantile(np.arange(10.0), 0.9))


# -------------------------------------------------------------------------------------------- WebRL


def _np_webrl_actor_loss(log_prob_tok, ref_log_prob_tok, mask, advantage, add_sft_loss=False):
  """numpy transcription of `webrl/algorithms/webrl/trainer.py:actor_loss` (l.151-215), line by line."""
  non_zero_counts = mask.sum(1)
  advantages = np.where(advantage >= 0, 1.0, -0.6)
  log_prob = (log_prob_tok * mask).sum(1)
  ref_log_prob = (ref_log_prob_tok * mask).sum(1)
  ref_prob = np.exp(ref_log_prob / non_zero_counts)
  beta = np.ones_like(advantages)
  beta[(advantages >= 0) & (ref_prob >= 0.8)] = 5.0
  beta[(advantages < 0) & (ref_prob < 0.9)] = 5.0
  m = (advantages > 0).astype(np.float64)
  non_zero_counts_mask = non_zero_counts[m.astype(bool)].sum()
  safe_count = non_zero_counts_mask if non_zero_counts_mask > 0 else 1.0
  log_prob_ratio = (log_prob - ref_log_prob) / safe_count
  with np.errstate(divide="ignore"):
    ratio = np.abs(advantages / log_prob_ratio)
  beta = np.where(beta <= ratio, beta, ratio)
  x = beta * log_prob_ratio - advantages
  smooth_l1 = np.where(np.abs(x) < 1, 0.5 * x ** 2, np.abs(x) - 0.5)
  loss = (np.reciprocal(beta) * smooth_l1 * m).mean()
  if add_sft_loss:
    coefficient = np.exp(1 - np.exp(log_prob / non_zero_counts))
    loss += -(log_prob * coefficient)[m.astype(bool)].sum() / safe_count
  return loss


def _webrl_case(seed):
  rng = np.random.default_rng(seed)
  b, t = 7, 6
  mask = (np.arange(t)[None] < rng.integers(1, t + 1, size=(b, 1))).astype(np.float64)
  lp = np.log(rng.uniform(0.3, 1.0, size=(b, t)))
  ref = np.log(rng.uniform(0.5, 1.0, size=(b, t)))
  return lp, ref, mask, rng.uniform(-1, 1, size=b)


@pytest.mark.parametrize("seed,add_sft", [(0, False), (1, False), (2, True), (3, False)])
@pytest.mark.slow
def test_webrl_actor_loss_code_batch_normalised_matches_numpy_transcription_of_a_batch(seed, add_sft):
  lp, ref, mask, adv = _webrl_case(seed)
  ours, aux = L.webrl_actor_loss_code(jnp.asarray(lp), jnp.asarray(ref), mask, jnp.asarray(adv), add_sft, "batch")
  np.testing.assert_allclose(ours, _np_webrl_actor_loss(lp, ref, mask, adv, add_sft), rtol=2e-5)
  np.testing.assert_array_equal(aux["mask"], adv >= 0)


@pytest.mark.parametrize("seed,add_sft", [(0, False), (1, False), (2, True), (3, True)])
def test_webrl_actor_loss_code_is_the_mean_of_the_codes_batches_of_one(seed, add_sft):
  """The original trains at `batch_size: 1` per device, DDP and gradient accumulation averaging: each sample's
  log-ratio over its own tokens. The default loss on a batch is the mean of the transcription on each sample."""
  lp, ref, mask, adv = _webrl_case(seed)
  ours, aux = L.webrl_actor_loss_code(jnp.asarray(lp), jnp.asarray(ref), mask, jnp.asarray(adv), add_sft)
  per_device = [_np_webrl_actor_loss(lp[i:i + 1], ref[i:i + 1], mask[i:i + 1], adv[i:i + 1], add_sft)
                for i in range(len(adv))]
  np.testing.assert_allclose(ours, np.mean(per_device), rtol=2e-5)
  n = mask.sum(1)
  kept = adv >= 0
  ratio = ((lp - ref) * mask).sum(1)
  np.testing.assert_allclose(aux["log_ratio"], np.where(kept, ratio / n, ratio), rtol=1e-5)  # 1 when masked out


@pytest.mark.slow
def test_webrl_actor_loss_code_per_sample_and_per_batch_by_hand():
  """A: 2 tokens, lp −1, lp_ref −2 (p_ref e^−1 < 0.8: β0 1); B: 4 tokens, lp −0.2, lp_ref −0.6 (p_ref e^−0.15 ≥ 0.8:
  β0 5); both A ≥ 0, so Â = 1. Per sample: ρ = 1/2 and 0.1, β = min(1, 2) = 1 and min(5, 10) = 5, SmoothL1 of
  −0.5 twice: (0.125 / 1 + 0.125 / 5) / 2 = 0.075. Per batch (N = 6): ρ = 1/6 and 1/15, β = 1 and 5, SmoothL1 of
  −5/6 and −2/3: (25/72 + (2/9) / 5) / 2 = 0.1958."""
  lp = jnp.array([[-0.5, -0.5, 0.0, 0.0], [-0.05, -0.05, -0.05, -0.05]])
  ref = jnp.array([-2.0, -0.6])
  mask = jnp.array([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
  adv = jnp.array([0.3, 1.0])
  loss, aux = L.webrl_actor_loss_code_seq(lp, mask, ref, adv)
  np.testing.assert_allclose(loss, 0.075, rtol=1e-6)
  np.testing.assert_allclose(aux["log_ratio"], [0.5, 0.1], rtol=1e-6)
  np.testing.assert_allclose(aux["beta"], [1.0, 5.0])
  loss, aux = L.webrl_actor_loss_code_seq(lp, mask, ref, adv, normalize="batch")
  np.testing.assert_allclose(loss, (25 / 72 + 2 / 45) / 2, rtol=1e-6)
  np.testing.assert_allclose(aux["log_ratio"], [1 / 6, 0.4 / 6], rtol=1e-6)
  # the per-token gradient of A: SmoothL1'(−0.5) · dρ/dlp / B = −0.5 · (1/2) / 2 per sample, · (1/6) per batch
  g = jax.grad(lambda x: L.webrl_actor_loss_code_seq(x, mask, ref, adv)[0])(lp)
  np.testing.assert_allclose(g[0, :2], [-0.125, -0.125], rtol=1e-5)
  g = jax.grad(lambda x: L.webrl_actor_loss_code_seq(x, mask, ref, adv, normalize="batch")[0])(lp)
  np.testing.assert_allclose(g[0, :2], [-5 / 72, -5 / 72], rtol=1e-5)  # −(5/6) · (1/6) / 2
  with pytest.raises(ValueError, match="normalize='token'"):
    L.webrl_actor_loss_code_seq(lp, mask, ref, adv, normalize="token")


@pytest.mark.slow
def test_webrl_actor_loss_code_gradient_only_from_positive_samples():
  rng = np.random.default_rng(4)
  lp = jnp.asarray(np.log(rng.uniform(0.3, 1.0, size=(4, 3))), jnp.float32)
  ref = jnp.asarray(np.log(rng.uniform(0.3, 1.0, size=(4, 3))), jnp.float32)
  adv = jnp.array([0.5, -0.3, 0.0, -1.0])  # Â = [1, -0.6, 1, -0.6]: samples 1 and 3 are masked out
  g = jax.grad(lambda x: L.webrl_actor_loss_code(x, ref, jnp.ones((4, 3)), adv)[0])(lp)
  assert float(jnp.abs(g[1]).sum()) == 0 and float(jnp.abs(g[3]).sum()) == 0
  assert float(jnp.abs(g[0]).sum()) > 0 and float(jnp.abs(g[2]).sum()) > 0


def test_webrl_advantage_code_clamps():
  a = L.webrl_advantage_code(jnp.array([0.2, 0.9]), jnp.array([0.6, 0.1]), jnp.array([1.0, 0.0]),
                             jnp.array([0.9, 0.0]))
  np.testing.assert_allclose(a, [1.0, -0.85], rtol=1e-6)  # 0.6-0.2-0.05+1+0.9 = 2.25 -> 1; 0.1-0.9-0.05 = -0.85


def test_webrl_actor_loss_paper_hand_computed():
  loss = L.webrl_actor_loss_paper(2.0, jnp.array([-1.0, -2.0]), jnp.array([-1.5, -1.0]), jnp.array([1.0, 0.0]))
  # (2 * 0.5 - 1)^2 = 0, (2 * -1 - 0)^2 = 4 -> mean 2
  np.testing.assert_allclose(loss, 2.0)


def test_rank_score_and_perplexity_filter():
  logp = jnp.log(jnp.array([[0.5, 0.8], [0.97, 0.97], [0.5, 0.5], [0.9, 1.0]]))
  mask = jnp.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
  score = L.webrl_rank_score(logp, mask)
  np.testing.assert_allclose(score, [math.sqrt(0.4), 0.97, 0.5, 0.9], rtol=1e-5)
  np.testing.assert_array_equal(L.perplexity_replay_filter(score), [True, False, False, True])  # 0.5 < s ≤ 0.95
  np.testing.assert_array_equal(L.perplexity_replay_filter(jnp.array([0.95, 0.9500001])), [True, False])


# ------------------------------------------------------------------------------------------- jit


@pytest.mark.slow
def test_losses_are_jittable():
  b, n = 3, 4
  key = jax.random.key(0)
  q = jax.random.uniform(key, (b, n, 2))
  v = jax.random.uniform(key, (b, 2))
  valid = jnp.ones((b, n), bool)
  sel = jax.jit(L.best_of_n_select, static_argnames=("head_reduce", "include_index0"))
  idx, adv = sel(q, v, valid, head_reduce="max")
  idx2, adv2 = L.best_of_n_select(q, v, valid)
  np.testing.assert_array_equal(idx, idx2)
  np.testing.assert_allclose(adv, adv2)
  w = jax.jit(L.best_of_n_weights, static_argnames=("kind",))(adv, kind="pg")
  np.testing.assert_allclose(w, L.best_of_n_weights(adv2, "pg"))
  td = jax.jit(L.digiq_td_targets)(jnp.ones(b), jnp.zeros(b), 0.95, v[:, 0], v[:, 1], v[:, 0], v[:, 1])
  np.testing.assert_allclose(td[0][0], 1 + 0.95 * v[:, 0], rtol=1e-6)
  lw = jax.jit(L.webrl_actor_loss_code)(jnp.log(q[..., 0]), jnp.log(q[..., 1]), jnp.ones((b, n)), adv)[0]
  assert np.isfinite(float(lw))


def test_head_value_and_reduce_heads():
  np.testing.assert_allclose(L.head_value(jnp.array([[0.3], [0.7]])), [0.3, 0.7])
  np.testing.assert_allclose(L.head_value(jnp.array([[0.0, math.log(3.0)]]), "classification"), [0.75], rtol=1e-6)
  with pytest.raises(ValueError, match=r"\[\.\.\., 1\]"):
    L.head_value(jnp.array([0.3, 0.7]))  # a bare [B] is ambiguous: heads output [B, 1]
  v = jnp.array([[0.2, 0.6], [0.9, 0.1]])
  np.testing.assert_allclose(L.reduce_heads(v, "max"), [0.6, 0.9])
  np.testing.assert_allclose(L.reduce_heads(v, "min"), [0.2, 0.1])
