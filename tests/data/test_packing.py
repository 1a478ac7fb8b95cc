"""Packed rows train as their samples would one by one: the same per-token losses, no attention across borders."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.data import packing
from jaxagent.models import layers, llama
from jaxagent.train import losses


def _samples(rng, lengths):
  return [(rng.integers(1, 250, n).astype(np.int32), (rng.random(n) < 0.6).astype(np.int32)) for n in lengths]


def test_rows_hold_every_target_once_and_fill_best_fit():
  rng = np.random.default_rng(0)
  samples = _samples(rng, [9, 5, 3, 7, 2, 4])
  rows = packing.pack(samples, seq_len=10)
  assert rows["input_ids"].shape[1] == 10
  assert int((rows["segment_ids"] > 0).sum()) == sum(len(s[0]) - 1 for s in samples)
  assert len(rows["input_ids"]) == 3  # 8 | 6+4 ... best fit of 8,4,2,6,1,3 into 10s: 3 rows
  for r in range(len(rows["input_ids"])):  # inside a segment, each target is the next input
    seg = rows["segment_ids"][r]
    same = (seg[1:] == seg[:-1]) & (seg[1:] > 0)
    np.testing.assert_array_equal(rows["targets"][r][:-1][same], rows["input_ids"][r][1:][same])
  assert 0.7 < packing.fill(rows) <= 1.0


def test_segment_positions_restart_at_each_segment():
  seg = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0]])
  np.testing.assert_array_equal(layers.segment_positions(seg)[0], [0, 1, 2, 0, 1, 0, 0, 1])


def test_packed_loss_equals_each_sample_alone():
  cfg = llama.DecoderConfig.tiny(vocab_size=256)
  model = llama.init_decoder(cfg, seed=0)
  rng = np.random.default_rng(1)
  samples = _samples(rng, [12, 7, 5, 9])
  rows = packing.pack(samples, seq_len=16)
  assert len(rows["input_ids"]) < len(samples)  # something was packed together
  packed = jax.nn.log_softmax(model(jnp.asarray(rows["input_ids"]), segment_ids=jnp.asarray(rows["segment_ids"])))
  packed_nll = -jnp.take_along_axis(packed, jnp.asarray(rows["targets"])[..., None], -1)[..., 0]
  got = float((packed_nll * rows["loss_mask"]).sum())
  want = 0.0
  for ids, loss in samples:
    logp = jax.nn.log_softmax(model(jnp.asarray(ids[None, :-1])))
    nll = -jnp.take_along_axis(logp, jnp.asarray(ids[None, 1:, None]), -1)[..., 0]
    want += float((nll * loss[None, 1:]).sum())
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # the shared loss reads packed batches through `segment_ids`
  batch = {k: jnp.asarray(v) for k, v in rows.items()}
  value = losses.weighted_token_nll(model, batch)[0]
  np.testing.assert_allclose(float(value), want / rows["loss_mask"].sum(), rtol=1e-5)


def test_sparse_loss_equals_the_full_one_on_packed_rows():
  cfg = llama.DecoderConfig.tiny(vocab_size=256)
  model = llama.init_decoder(cfg, seed=0)
  rows = packing.pack(_samples(np.random.default_rng(2), [12, 7, 5, 9]), seq_len=16)
  batch = {k: jnp.asarray(v) for k, v in rows.items()}
  full, full_metrics = losses.weighted_token_nll(model, batch)
  sparse, metrics = losses.sparse_token_nll(int(rows["loss_mask"].sum(1).max()))(model, batch)
  np.testing.assert_allclose(float(sparse), float(full), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["token_accuracy"]), float(full_metrics["token_accuracy"]), rtol=1e-6)
