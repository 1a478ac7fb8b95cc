"""The shared SFT loss: plain assistant-token cross-entropy, or its per-sample weighted form."""

import jax
import numpy as np
import pytest

from jaxagent.train.losses import masked_cross_entropy, weighted_token_nll


def _batch(weight=None):
  rng = np.random.default_rng(0)
  batch = {"input_ids": np.zeros((3, 5), np.int32), "attention_mask": np.ones((3, 5), np.int32),
           "targets": rng.integers(0, 7, (3, 5)).astype(np.int32),
           "loss_mask": np.array([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [1, 1, 0, 0, 0]], np.int32)}
  if weight is not None:
    batch["weight"] = np.asarray(weight, np.float32)
  return batch


LOGITS = jax.random.normal(jax.random.key(1), (3, 5, 7))


def model(input_ids, attention_mask=None):
  del input_ids, attention_mask
  return LOGITS


@pytest.mark.slow
def test_unweighted_is_the_masked_cross_entropy_and_unit_weights_agree():
  plain, metrics = weighted_token_nll(model, _batch())
  expected, count = masked_cross_entropy(LOGITS, _batch()["targets"], _batch()["loss_mask"])
  assert float(plain) == float(expected) and float(metrics["loss_tokens"]) == float(count) == 8
  ones, _ = weighted_token_nll(model, _batch([1.0, 1.0, 1.0]))
  np.testing.assert_allclose(float(ones), float(plain), rtol=1e-6)


def test_weights_scale_each_samples_tokens_and_keep_the_token_normaliser():
  logp = np.asarray(jax.nn.log_softmax(LOGITS, -1))
  b = _batch([2.0, 0.0, 0.5])
  tok = np.take_along_axis(logp, b["targets"][..., None], -1)[..., 0] * b["loss_mask"]
  expected = -(2.0 * tok[0].sum() + 0.5 * tok[2].sum()) / b["loss_mask"].sum()
  loss, _ = weighted_token_nll(model, b)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
