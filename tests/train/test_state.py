"""Train state construction, checkpoint round trip and the metrics/profiler side outputs."""

import json
import os

import jax
import numpy as np
import optax
import pytest

from jaxagent import sharding
from jaxagent.models.llama import DecoderConfig, init_decoder
from jaxagent.train.checkpoint import Checkpointer
from jaxagent.train.metrics import MetricWriter, read_jsonl
from jaxagent.train.profiler import ProfileWindow
from jaxagent.train.state import abstract_train_state, create_train_state, create_train_state_from_model

CFG = DecoderConfig.tiny(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=16,
                         intermediate_size=64)


@pytest.mark.slow
def test_from_model_keeps_weights_and_shards_by_the_rules(tmp_path):
  mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
  model = init_decoder(CFG, seed=3)
  ts = create_train_state_from_model(model, optax.adam(1e-3), mesh)
  up = ts.state[0]["layers"][0]["mlp"]["up_proj"]["kernel"].get_value()
  np.testing.assert_array_equal(np.asarray(up), np.asarray(model.layers[0].mlp.up_proj.kernel.get_value()))
  assert up.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  assert ts.step == 0

  # Orbax round trip: state, RNG and data position come back, into the same shardings.
  ckpt = Checkpointer(str(tmp_path / "ckpt"), every=1, async_save=False)
  rng = jax.random.key(42)
  assert ckpt.save(5, ts.state, rng, {"next_index": 17}, meta={"note": "x"})
  ckpt.close()
  fresh = create_train_state(lambda: init_decoder(CFG, seed=0), optax.adam(1e-3), mesh)
  state, rng2, data, meta = Checkpointer(str(tmp_path / "ckpt")).restore(fresh.abstract_state(), jax.random.key(0))
  restored = state[0]["layers"][0]["mlp"]["up_proj"]["kernel"].get_value()
  np.testing.assert_array_equal(np.asarray(restored), np.asarray(up))
  assert restored.sharding == up.sharding
  assert data == {"next_index": 17} and meta == {"note": "x"}
  np.testing.assert_array_equal(jax.random.key_data(rng2), jax.random.key_data(rng))


@pytest.mark.slow
def test_abstract_state_holds_no_arrays_and_restores_a_checkpoint(tmp_path):
  mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
  ts = create_train_state_from_model(init_decoder(CFG, seed=3), optax.adam(1e-3), mesh)
  ckpt = Checkpointer(str(tmp_path / "ckpt"), every=1, async_save=False)
  assert ckpt.save(2, ts.state, jax.random.key(1))
  ckpt.close()
  abstract = abstract_train_state(lambda: init_decoder(CFG, seed=0), optax.adam(1e-3), mesh)
  leaves = jax.tree.leaves(abstract.state)
  assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)  # nothing initialised
  state = Checkpointer(str(tmp_path / "ckpt")).restore(abstract.abstract_state(), jax.random.key(0))[0]
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(ts.state)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert got.sharding == want.sharding


def test_nothing_to_restore_is_none(tmp_path):
  ts = create_train_state(lambda: init_decoder(CFG), optax.adam(1e-3),
                          sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1]))
  assert Checkpointer(str(tmp_path / "empty")).restore(ts.abstract_state(), jax.random.key(0)) is None


def test_metric_writer_jsonl_and_events(tmp_path):
  w = MetricWriter(str(tmp_path))
  w.write_scalars(3, {"loss": np.float32(1.5), "lr": 0.1})
  w.write_texts(3, {"sample": "hello"})
  w.write_images(3, {"img": np.zeros((2, 4, 4, 3), np.float32)})
  w.close()
  rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert rows[0]["step"] == 3 and rows[0]["loss"] == 1.5
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path))


def test_profile_window_writes_a_trace(tmp_path):
  window = ProfileWindow(str(tmp_path), start_step=1, num_steps=2)
  f = jax.jit(lambda x: x @ x)
  for step in range(4):
    window.before_step(step)
    assert window.active == (1 <= step < 3)
    out = f(np.ones((32, 32), np.float32))
    window.after_step(step, out)
  window.close()
  traces = [os.path.join(r, n) for r, _, ns in os.walk(tmp_path / "profile") for n in ns]
  assert any(t.endswith(".xplane.pb") for t in traces), traces
