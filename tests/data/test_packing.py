"""Packed rows train as their samples would one by one: the same per-token losses, no attention across borders."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import il as il_config
from configs import webrl as webrl_config
from jaxagent.data import conversation, packing, pipeline
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.models import layers, llama
from jaxagent.pipeline import finetune
from jaxagent.pipeline.config import ConfigError, validate
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_sparse_loss_equals_the_full_one_on_packed_rows():
  cfg = llama.DecoderConfig.tiny(vocab_size=256)
  model = llama.init_decoder(cfg, seed=0)
  rows = packing.pack(_samples(np.random.default_rng(2), [12, 7, 5, 9]), seq_len=16)
  batch = {k: jnp.asarray(v) for k, v in rows.items()}
  full, full_metrics = losses.weighted_token_nll(model, batch)
  sparse, metrics = losses.sparse_token_nll(int(rows["loss_mask"].sum(1).max()))(model, batch)
  np.testing.assert_allclose(float(sparse), float(full), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["token_accuracy"]), float(full_metrics["token_accuracy"]), rtol=1e-6)


# -- the SFT path: `pipeline.pack_samples` and `pipeline.finetune`'s `data.packing` ------------------------------

def _items(weights=None):
  texts = [("Open the cart.", "click [12]"), ("Which page lists shoes? Answer briefly.", "answer [shoes]"),
           ("Sort by price.", "click [3]"), ("Scroll down twice and read the footer.", "scroll [down]"),
           ("Go back.", "back")]
  items = [{"id": f"s{k}", "images": [], "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
           for k, (q, a) in enumerate(texts)]
  for item, w in zip(items, weights or ()):
    item["weight"] = w
  return items


@pytest.mark.parametrize("weights", [None, [1.0, 0.5, 2.0, 0.0, 1.5]])
@pytest.mark.slow
def test_packed_sft_rows_give_the_padded_batches_loss(weights):
  tokenizer = load_tokenizer(None)
  items = _items(weights)
  cfg = llama.DecoderConfig.tiny(vocab_size=-(-len(tokenizer) // 64) * 64)
  model = llama.init_decoder(cfg, seed=0)
  longest = max(len(conversation.tokenize(x, tokenizer, 1)[0]) for x in items)
  encode = pipeline.EncodeSample(tokenizer, seq_len=longest - 1)
  padded = {k: np.stack([encode(x)[k] for x in items]) for k in encode(items[0])}
  rows = pipeline.pack_samples(items, tokenizer, seq_len=2 * longest)
  assert len(rows["input_ids"]) < len(items)  # samples share rows
  assert rows["loss_mask"].sum() == padded["loss_mask"].sum()
  if weights:
    assert rows["weight"].shape == rows["input_ids"].shape
  for loss in (losses.weighted_token_nll,):
    want, want_metrics = loss(model, {k: jnp.asarray(v) for k, v in padded.items()})
    got, metrics = loss(model, {k: jnp.asarray(v) for k, v in rows.items()})
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["token_accuracy"]), float(want_metrics["token_accuracy"]), rtol=1e-6)


def _stage(packing_value=None, kind="decoder"):
  config = il_config.get_config("text")
  config.model.kind = kind
  if packing_value is not None:
    config.data.packing = packing_value
  return config, types.SimpleNamespace(kind=kind)


def test_auto_packs_a_text_decoder_under_a_token_level_loss_and_pads_otherwise():
  assert finetune._packs(*_stage(), losses.weighted_token_nll)
  assert finetune._packs(*_stage("auto"), losses.weighted_token_nll)
  assert not finetune._packs(*_stage("pad"), losses.weighted_token_nll)
  assert not finetune._packs(*_stage(kind="vlm"), losses.weighted_token_nll)  # images ride one sample a row
  assert not finetune._packs(*_stage(), losses.sequence_nll())  # per-sample sums: one sample a row


@pytest.mark.parametrize("value,kind,loss,needle", [
    ("pack", "vlm", losses.weighted_token_nll, r"config\.data\.packing='pack' but model\.kind='vlm' is not a text "
                                               r"decoder; set --config\.data\.packing=auto"),
    ("pack", "decoder", losses.sequence_nll(), r"config\.data\.packing='pack' but this stage's loss .* reads one "
                                               r"sample a row"),
    ("rows", "decoder", losses.weighted_token_nll, r"config\.data\.packing='rows' is not one of \('auto', 'pack', "
                                                   r"'pad'\)"),
])
def test_a_packing_that_cannot_apply_is_refused_naming_the_key(value, kind, loss, needle):
  with pytest.raises(ValueError, match=needle):
    finetune._packs(*_stage(value, kind), loss)


def test_config_validation_refuses_a_bad_packing_before_any_work():
  config = webrl_config.get_config("smoke")
  config.data.packing = "bucket"
  with pytest.raises(ConfigError, match=r"config\.data\.packing='bucket' is not one of"):
    validate(config)
