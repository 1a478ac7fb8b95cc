"""The jitted train step: shardings follow the rules, 8 devices match 1, accumulation matches one big batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxagent import config_lib as common
from jaxagent import sharding
from jaxagent.models.llama import DecoderConfig, init_decoder
from jaxagent.train.losses import masked_cross_entropy
from jaxagent.train.optim import make_optimizer
from jaxagent.train.state import create_train_state
from jaxagent.train.step import build_train_step, put_batch

CFG = DecoderConfig.tiny(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         head_dim=8, intermediate_size=64)


def lm_loss(model, batch, rng):
  del rng
  logits = model(batch["input_ids"], attention_mask=batch["attention_mask"])
  loss, count = masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
  return loss, {"loss_tokens": count}


def make_batch(batch=8, seq=16, seed=0):
  rs = np.random.RandomState(seed)
  ids = rs.randint(0, CFG.vocab_size, (batch, seq + 1)).astype(np.int32)
  lengths = rs.randint(seq // 2, seq + 1, batch)
  attn = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  # Padded rows of different lengths, but the same number of loss tokens per row, so the mean over a batch
  # equals the mean of its micro-batches' means (accumulation is then exact).
  loss_mask = np.zeros_like(attn)
  for row, n in enumerate(lengths):
    loss_mask[row, rs.choice(n, seq // 2, replace=False)] = 1
  return {"input_ids": ids[:, :-1], "targets": ids[:, 1:], "attention_mask": attn, "loss_mask": loss_mask}


def run_steps(mesh, n=2, accum=1, batch=None):
  optim = common.base_config().optim
  tx, schedule = make_optimizer(optim, total_steps=10)
  ts = create_train_state(lambda: init_decoder(CFG, 0), tx, mesh)
  batch = make_batch() if batch is None else batch
  step, b_shard = build_train_step(ts, lm_loss, schedule, mesh, batch, grad_accum_steps=accum)
  losses = []
  for i in range(n):
    with jax.set_mesh(mesh):
      ts.state, metrics = step(ts.state, put_batch(batch, b_shard), jax.random.key(i))
    losses.append(float(metrics["loss"]))
  return ts, losses, metrics


@pytest.fixture(scope="module")
def one_device():
  return run_steps(sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1]))


@pytest.mark.slow
def test_eight_devices_shard_params_and_match_one_device(one_device):
  assert jax.device_count() == 8
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  ts, losses, _ = run_steps(mesh)
  model_state = ts.state[0]
  q = model_state["layers"][0]["self_attn"]["q_proj"]["kernel"].get_value()  # (embed, heads, head_dim)
  assert q.sharding.spec == P("fsdp", "tensor")
  up = model_state["layers"][0]["mlp"]["up_proj"]["kernel"].get_value()  # (embed, mlp)
  assert up.sharding.spec == P("fsdp", "tensor")
  assert len(up.addressable_shards) == 8 and up.addressable_shards[0].data.shape == (16, 32)
  # Optimizer moments are sharded like their parameters.
  mu = ts.state[1]["opt_state"][1][0]["mu"]["layers"][0]["mlp"]["up_proj"]["kernel"].get_value()
  assert mu.sharding.spec == P("fsdp", "tensor")
  np.testing.assert_allclose(losses, one_device[1], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_grad_accumulation_matches_full_batch(one_device):
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  _, full, m_full = one_device
  _, accum, m_acc = run_steps(mesh, n=2, accum=4)
  np.testing.assert_allclose(accum, full, rtol=1e-5)
  np.testing.assert_allclose(float(m_acc["grad_norm"]), float(m_full["grad_norm"]), rtol=1e-4)


def test_loss_falls_and_step_counts(one_device):
  ts, losses, metrics = one_device
  assert ts.step == 2
  assert all(np.isfinite(losses)) and float(metrics["lr"]) > 0


def test_masked_cross_entropy_ignores_masked_tokens():
  logits = jnp.log(jnp.array([[[0.5, 0.5], [0.9, 0.1], [0.1, 0.9]]]))
  targets = jnp.array([[0, 0, 0]])
  loss, count = masked_cross_entropy(logits, targets, jnp.array([[1, 1, 0]]))
  assert float(count) == 2
  np.testing.assert_allclose(float(loss), -(np.log(0.5) + np.log(0.9)) / 2, rtol=1e-6)
