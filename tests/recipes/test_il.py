"""End to end: the IL recipe's smoke config trains the tiny VLM on synthetic OWV conversations; the loss is
finite and falls, and the final checkpoint restores the trained weights."""

import os

import jax
import numpy as np
import pytest

from configs import il as il_config
from jaxagent import sharding
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.recipes import il
from jaxagent.train.checkpoint import Checkpointer
from jaxagent.train.metrics import read_jsonl
from jaxagent.train.optim import make_optimizer
from jaxagent.train.state import create_train_state


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("il"))
  config = il_config.get_config("smoke")
  config.train.steps = 8
  return config, workdir, il.train_il(config, workdir)


def test_loss_is_finite_and_falls(run):
  config, workdir, _ = run
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  losses = [r["loss"] for r in rows]
  assert len(losses) == config.train.steps and np.isfinite(losses).all()
  assert np.mean(losses[-2:]) < losses[0] - 0.5
  assert all(r["loss_tokens"] > 0 for r in rows)
  assert "mfu" in rows[-1] and 0 < rows[-1]["mfu"] < 1.5
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(workdir))


def test_checkpoint_restores_trained_weights(run):
  config, workdir, path = run
  assert path.endswith(f"checkpoints/{config.train.steps}")
  tokenizer = load_tokenizer(os.path.join(workdir, "tokenizer"))
  model_fn, _, _, _ = il.build_model(config, tokenizer)
  tx, _ = make_optimizer(config.optim, config.train.steps)
  mesh = sharding.make_mesh(dict(config.mesh))
  fresh = create_train_state(model_fn, tx, mesh)
  state, _, data_state, _ = Checkpointer(os.path.join(workdir, "checkpoints")).restore(
      fresh.abstract_state(), jax.random.key(0))
  fresh_kernel = fresh.state[0]["projector"]["linear_1"]["kernel"].get_value()
  kernel = state[0]["projector"]["linear_1"]["kernel"].get_value()
  assert kernel.sharding == fresh_kernel.sharding
  assert not np.allclose(np.asarray(kernel), np.asarray(fresh_kernel))  # trained, not the init
  assert int(state[1]["step"].get_value()) == config.train.steps
  assert data_state["next_index"] == config.train.steps  # one batch consumed per step


def test_first_sample_preview_brackets_assistant_text(run):
  _, workdir, _ = run
  tokenizer = load_tokenizer(os.path.join(workdir, "tokenizer"))
  arrays = {"targets": np.array(tokenizer("User: a<end_of_utterance>\nAssistant: b<end_of_utterance>")["input_ids"])}
  n = len(arrays["targets"])
  arrays["attention_mask"] = np.ones(n, np.int32)
  arrays["loss_mask"] = np.zeros(n, np.int32)
  arrays["loss_mask"][-2:] = 1
  assert il._sample_preview(tokenizer, arrays).endswith("Assistant:⟦ b<end_of_utterance>⟧")
