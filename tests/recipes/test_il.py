"""End to end: the IL recipe's smoke config trains the tiny VLM on synthetic OWV conversations; the loss is
finite and falls, and the final checkpoint restores the trained weights."""

import os

import jax
import numpy as np
import pytest

from configs import il as il_config
from jaxagent import models, sharding
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.pipeline import finetune
from jaxagent.recipes import il
from jaxagent.train.checkpoint import Checkpointer
from jaxagent.train.losses import weighted_token_nll
from jaxagent.train.metrics import read_jsonl
from jaxagent.train.optim import make_optimizer
from jaxagent.train.state import create_train_state

pytestmark = pytest.mark.slow  # the module trains the IL stage once


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("il"))
  config = il_config.get_config("smoke")
  config.train.steps = 8
  return config, workdir, il.run(config, workdir)


@pytest.mark.slow
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
  model_fn = models.build(config, tokenizer).init
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
  assert finetune._preview(tokenizer, arrays).endswith("Assistant:⟦ b<end_of_utterance>⟧")


@pytest.mark.slow
def test_starts_from_a_hugging_face_checkpoint(tmp_path):
  """`model.hf_checkpoint`: weights and tokenizer come from a local HF directory (here a Llama we export)."""
  from jaxagent.data import pipeline
  from jaxagent.models.hf import llama as hf_llama
  from jaxagent.models.llama import DecoderConfig, init_decoder

  tokenizer = load_tokenizer()
  dcfg = DecoderConfig.tiny(vocab_size=1024, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            head_dim=16, intermediate_size=64, pad_token_id=tokenizer.pad_token_id)
  hf_dir = str(tmp_path / "hf")
  saved = init_decoder(dcfg, seed=7)
  hf_llama.save_pretrained(saved, dcfg, hf_dir)
  tokenizer.save_pretrained(hf_dir)

  config = il_config.get_config("smoke")
  config.model.kind = "decoder"
  config.model.hf_checkpoint = hf_dir
  config.train.steps = 2
  workdir = str(tmp_path / "run")
  il.run(config, workdir)

  items = il.load_items(config, workdir)
  encode = pipeline.EncodeSample(load_tokenizer(hf_dir), config.data.seq_len)
  first = pipeline.il_dataset(items, encode, batch_size=config.train.batch_size, seed=int(config.seed))[0]
  expected, _ = weighted_token_nll(saved, first, None)
  first_logged = read_jsonl(os.path.join(workdir, "metrics.jsonl"))[0]
  np.testing.assert_allclose(first_logged["loss"], float(expected), rtol=1e-5)
