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


def _hf_decoder(tmp_path):
  """A tiny Llama exported as a HF directory with the embedded tokenizer: (directory, the model)."""
  from jaxagent.models.hf import llama as hf_llama  # pylint: disable=g-import-not-at-top
  from jaxagent.models.llama import DecoderConfig, init_decoder  # pylint: disable=g-import-not-at-top
  tokenizer = load_tokenizer()
  dcfg = DecoderConfig.tiny(vocab_size=1024, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            head_dim=16, intermediate_size=64, pad_token_id=tokenizer.pad_token_id)
  hf_dir = str(tmp_path / "hf")
  saved = init_decoder(dcfg, seed=7)
  hf_llama.save_pretrained(saved, dcfg, hf_dir)
  tokenizer.save_pretrained(hf_dir)
  return hf_dir, saved


@pytest.mark.parametrize("packing", ["pad", "auto"])
def test_starts_from_a_hugging_face_checkpoint(tmp_path, packing):
  """`model.hf_checkpoint`: weights and tokenizer come from a local HF directory (here a Llama we export); the
  first step's loss is that of the first batch the data path builds, one sample a row (`data.packing=pad`) or
  packed rows (auto, for this text decoder)."""
  from jaxagent.data import pipeline  # pylint: disable=g-import-not-at-top
  hf_dir, saved = _hf_decoder(tmp_path)
  config = il_config.get_config("smoke")
  config.model.kind = "decoder"
  config.model.hf_checkpoint = hf_dir
  config.data.packing = packing
  config.train.steps = 2
  workdir = str(tmp_path / "run")
  il.run(config, workdir)

  items = il.load_items(config, workdir)
  tokenizer = load_tokenizer(hf_dir)
  encode = finetune._encode_decoder_only(config, models.build(config, tokenizer), tokenizer, items, 32, True)
  if packing == "pad":
    first = pipeline.il_dataset(items, encode, batch_size=config.train.batch_size, seed=int(config.seed))[0]
  else:
    rows = pipeline.pack_samples(items, tokenizer, encode.seq_len)
    assert len(rows["input_ids"]) < len(items)
    first = pipeline.rows_dataset(rows, batch_size=config.train.batch_size, seed=int(config.seed))[0]
  expected, _ = weighted_token_nll(saved, first, None)
  first_logged = read_jsonl(os.path.join(workdir, "metrics.jsonl"))[0]
  np.testing.assert_allclose(first_logged["loss"], float(expected), rtol=1e-5)
