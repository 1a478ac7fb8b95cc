"""WebRL's actor losses on training batches: the samples carry their advantage and the reference's log-probability."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.rl import losses as rl_losses
from jaxagent.train.losses import webrl_actor_loss, webrl_actor_loss_paper

LOGITS = jax.random.normal(jax.random.key(2), (3, 5, 7))
MASK = np.array([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [1, 1, 0, 0, 0]], np.int32)


def model(input_ids, attention_mask=None):
  del input_ids, attention_mask
  return LOGITS


def _batch():
  rng = np.random.default_rng(0)
  return {"input_ids": np.zeros((3, 5), np.int32), "attention_mask": np.ones((3, 5), np.int32),
          "targets": rng.integers(0, 7, (3, 5)).astype(np.int32), "loss_mask": MASK,
          "advantage": np.array([0.3, -0.2, 1.0], np.float32), "ref_logp": np.array([-4.0, -2.5, -1.0], np.float32)}


def _token_logp(batch):
  logp = np.asarray(jax.nn.log_softmax(LOGITS, -1))
  return np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]


@pytest.mark.slow
def test_code_loss_on_a_batch_is_the_code_loss_of_its_token_logprobs():
  b = _batch()
  loss, metrics = webrl_actor_loss()(model, b)
  expected, aux = rl_losses.webrl_actor_loss_code_seq(jnp.asarray(_token_logp(b)), MASK, b["ref_logp"],
                                                      b["advantage"])
  np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)
  np.testing.assert_allclose(float(metrics["trained_fraction"]), 2 / 3, rtol=1e-6)  # A < 0: masked out
  np.testing.assert_array_equal(aux["mask"], [1.0, 0.0, 1.0])


@pytest.mark.slow
def test_sequence_reference_equals_the_per_token_form():
  b = _batch()
  rng = np.random.default_rng(1)
  ref_tok = np.log(rng.uniform(0.3, 1.0, (3, 5))).astype(np.float32)
  ref_sum = np.where(MASK > 0, ref_tok, 0.0).sum(-1)
  lp = jnp.asarray(_token_logp(b))
  per_token = rl_losses.webrl_actor_loss_code(lp, jnp.asarray(ref_tok), MASK, b["advantage"], True)[0]
  summed = rl_losses.webrl_actor_loss_code_seq(lp, MASK, ref_sum, b["advantage"], True)[0]
  np.testing.assert_allclose(float(per_token), float(summed), rtol=1e-6)


def test_paper_loss_is_the_squared_regression_of_sequence_log_ratios():
  b = _batch()
  lp = np.where(MASK > 0, _token_logp(b), 0.0).sum(-1)
  expected = np.mean((0.5 * (lp - b["ref_logp"]) - b["advantage"]) ** 2)
  loss, _ = webrl_actor_loss_paper(0.5)(model, b)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_code_loss_normalises_per_sample_by_default_and_per_batch_on_request():
  b = _batch()
  tok = jnp.asarray(_token_logp(b))
  sample, _ = webrl_actor_loss()(model, b)
  batch, _ = webrl_actor_loss(normalize="batch")(model, b)
  np.testing.assert_allclose(float(sample), float(rl_losses.webrl_actor_loss_code_seq(
      tok, MASK, b["ref_logp"], b["advantage"], normalize="sample")[0]), rtol=1e-6)
  np.testing.assert_allclose(float(batch), float(rl_losses.webrl_actor_loss_code_seq(
      tok, MASK, b["ref_logp"], b["advantage"], normalize="batch")[0]), rtol=1e-6)
  assert abs(float(sample) - float(batch)) > 1e-4
