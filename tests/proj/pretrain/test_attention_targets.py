"""The attention-target loss reads the decoder's own attention: the probabilities it scores are the ones the
model attends with, within a packed row's segments."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from jaxagent.models import layers, llama
from jaxagent.proj.pretrain import targets
from jaxagent.train.losses import sparse_token_nll


def _model():
  cfg = llama.DecoderConfig.tiny(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                                 intermediate_size=64, vocab_size=64, max_position_embeddings=64)
  return llama.init_decoder(cfg, 0)


def _batch():
  rng = np.random.default_rng(0)
  ids = rng.integers(1, 64, (1, 12)).astype(np.int32)
  seg = np.array([[1] * 5 + [2] * 6 + [0]], np.int32)
  targets_ = np.roll(ids, -1, 1)
  loss = np.zeros_like(ids)
  loss[0, [3, 8, 9]] = 1
  return {"input_ids": ids, "targets": targets_, "loss_mask": loss, "segment_ids": seg}


def _attention_probs(model, layer, batch):
  """The decoder's own attention weights of `layer` [B, H, T, T], recovered from its output head by head."""
  xs = []
  model.hidden_states(jnp.asarray(batch["input_ids"]), segment_ids=jnp.asarray(batch["segment_ids"]), layer_inputs=xs)
  block, cfg = model.layers[layer], model.config
  h = block.input_layernorm(xs[layer])
  seg = jnp.asarray(batch["segment_ids"])
  pos = layers.segment_positions(seg)
  inv = layers.rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
  q = layers.apply_rope(block.self_attn.q_proj(h), pos, inv)
  k = layers.apply_rope(block.self_attn.k_proj(h), pos, inv)
  k = jnp.repeat(k, cfg.num_heads // cfg.num_kv_heads, axis=2)
  mask = layers.attention_mask(*(jnp.broadcast_to(jnp.arange(seg.shape[1]), seg.shape),) * 2, seg > 0,
                               segment_ids=seg)
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(cfg.head_dim)
  probs = jax.nn.softmax(jnp.where(mask, scores, -1e9), -1)
  # the same weights reproduce the block's attention output (its values and output projection)
  v = jnp.repeat(block.self_attn.v_proj(h), cfg.num_heads // cfg.num_kv_heads, axis=2)
  mine = block.self_attn.o_proj(jnp.einsum("bhqk,bkhd->bqhd", probs, v))
  theirs, _ = block.self_attn(h, pos, inv, lambda: layers.SelfMask(seg > 0, pos, seg, None))
  valid = np.asarray(seg[0] > 0)
  np.testing.assert_allclose(np.asarray(mine)[0, valid], np.asarray(theirs)[0, valid], atol=1e-5)
  return np.asarray(probs), xs


@pytest.mark.parametrize("layer,heads,shift", [(1, 3, 1), (0, 1, 0)])
@pytest.mark.slow
def test_head_nll_is_minus_log_the_models_attention_on_the_source(layer, heads, shift):
  model, batch = _model(), _batch()
  probs, xs = _attention_probs(model, layer, batch)
  offsets = np.zeros_like(batch["input_ids"])
  wanted = {3: 1, 8: 6, 9: 7}  # query slot -> source slot (8 and 9 in segment 2, which starts at 5)
  for t, src in wanted.items():
    offsets[0, t] = t + shift - src
  got = targets.head_nll(model, xs[layer], layer, heads, jnp.asarray(offsets), shift, 4,
                         jnp.asarray(batch["segment_ids"]))
  expect = -np.mean([np.log(probs[0, h, t, src]) for t, src in wanted.items() for h in range(heads)])
  np.testing.assert_allclose(float(got), expect, rtol=1e-5)


@pytest.mark.slow
def test_weight_zero_is_the_plain_reply_loss_and_the_targets_train():
  model, batch = _model(), _batch()
  batch["reply_source"] = np.zeros_like(batch["input_ids"])
  batch["reply_source"][0, 8] = 3  # predicts token 9, read off slot 6
  batch["link_source"] = np.zeros_like(batch["input_ids"])
  batch["link_source"][0, 4] = 2
  batch["name_source"] = np.zeros_like(batch["input_ids"])
  batch["name_source"][0, 8] = 5
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  cfg = ml_collections.ConfigDict(dict(weight=0.0, reply_layer=-1, reply_heads=2, link_heads=1, name_layer=0,
                                       name_heads=1, previous_heads=1, readout=False,
                                       previous_readout_every=1, span_heads=0))
  most = dict.fromkeys(targets.FIELDS, 4)
  plain, _ = sparse_token_nll(4)(model, batch)
  off, metrics = targets.pretrain_loss(4, cfg, most)(model, batch)
  np.testing.assert_allclose(float(off), float(plain), rtol=1e-6)
  parts = ("reply_attention", "link_attention", "name_attention", "previous_attention")
  assert all(float(metrics[k]) > 0 for k in parts)
  cfg.weight = 1.0
  on, metrics = targets.pretrain_loss(4, cfg, most)(model, batch)
  np.testing.assert_allclose(float(on), float(plain) + sum(float(metrics[k]) for k in parts), rtol=1e-5)
  cfg.name_heads = 0
  _, metrics = targets.pretrain_loss(4, cfg, most)(model, batch)
  assert float(metrics["name_attention"]) == 0.0


@pytest.mark.slow
def test_the_previous_token_heads_are_scored_on_the_token_before_each_past_the_link_heads_keys():
  model, batch = _model(), _batch()  # 4 heads over 2 key-value heads: the link head is 0, so previous heads 2..
  cfg = ml_collections.ConfigDict(dict(weight=1.0, reply_layer=-1, reply_heads=0, link_heads=1, name_layer=0,
                                       name_heads=0, previous_heads=1, readout=False,
                                       previous_readout_every=1, span_heads=0))
  first = targets.previous_first(model.config, cfg)
  assert first == 2
  probs, _ = _attention_probs(model, 0, batch)
  batch.update({f: np.zeros_like(batch["input_ids"]) for f in targets.FIELDS})
  _, metrics = targets.pretrain_loss(4, cfg, dict.fromkeys(targets.FIELDS, 4))(model, batch)
  seg = batch["segment_ids"][0]
  pairs = [(t, t - 1) for t in range(1, len(seg)) if seg[t] > 0 and seg[t] == seg[t - 1]]
  assert len(pairs) == 9  # every token but each segment's first, not the padding
  expect = -np.mean([np.log(probs[0, first, t, s]) for t, s in pairs])
  np.testing.assert_allclose(float(metrics["previous_attention"]), expect, rtol=1e-5)


@pytest.mark.slow  # over 2 s alone
def test_readout_adds_the_heads_cross_entropy_on_the_source_token():
  model, batch = _model(), _batch()
  offsets = np.zeros_like(batch["input_ids"])
  offsets[0, 8] = 8 - 6
  args = (1, 2, jnp.asarray(offsets), 0, 4, jnp.asarray(batch["segment_ids"]), jnp.asarray(batch["input_ids"]))
  xs = []
  model.hidden_states(jnp.asarray(batch["input_ids"]), segment_ids=jnp.asarray(batch["segment_ids"]), layer_inputs=xs)
  plain = float(targets.head_nll(model, xs[1], *args))
  with_readout = float(targets.head_nll(model, xs[1], *args, readout=True))
  assert with_readout > plain + 1.0  # an untrained head names a token of 64 with ~log 64 nats


@pytest.mark.slow
def test_readout_every_kth_query_scores_those_queries_alone():
  model, batch = _model(), _batch()
  xs = []
  model.hidden_states(jnp.asarray(batch["input_ids"]), segment_ids=jnp.asarray(batch["segment_ids"]), layer_inputs=xs)

  def readout(queries, every):  # the readout's part: with it minus without it
    offsets = np.zeros_like(batch["input_ids"])
    offsets[0, queries] = 1
    args = (0, 1, jnp.asarray(offsets), 0, 12, jnp.asarray(batch["segment_ids"]), jnp.asarray(batch["input_ids"]))
    return (float(targets.head_nll(model, xs[0], *args, readout=True, readout_every=every))
            - float(targets.head_nll(model, xs[0], *args)))

  # queries 3 and 8 in that order, then the unflagged ones: every 2nd is query 3 alone
  np.testing.assert_allclose(readout([3, 8], 2), readout([3], 1), rtol=1e-5)
  assert abs(readout([3, 8], 1) - readout([3], 1)) > 1e-3


def test_copy_heads_make_value_then_output_a_scaled_projection():
  model = targets.copy_heads(_model(), 1, 3, 2.0)
  attn, cfg = model.layers[1].self_attn, model.config
  v, o = np.asarray(attn.v_proj.kernel.get_value()), np.asarray(attn.o_proj.kernel.get_value())
  for h in range(3):
    ov = v[:, h // 2, :] @ o[h]  # [E, E]: what head h writes for what it reads
    p = ov / 2.0
    np.testing.assert_allclose(p @ p, p, atol=1e-5)  # a projection
    assert round(float(np.trace(p))) == cfg.head_dim  # onto one head's worth of directions
  np.testing.assert_allclose(o[3], np.asarray(_model().layers[1].self_attn.o_proj.kernel.get_value())[3])


@pytest.mark.slow  # over 2 s alone
def test_span_heads_are_scored_on_the_mean_log_attention_over_the_names_tokens():
  model, batch = _model(), _batch()
  probs, xs = _attention_probs(model, 0, batch)
  spans = np.zeros_like(batch["input_ids"])
  spans[0, 3], spans[0, 9] = 3, 2  # keys 1..3, and 8..9 in segment 2
  got = targets.head_nll(model, xs[0], 0, 1, jnp.asarray(spans), 0, 4, jnp.asarray(batch["segment_ids"]), first=2,
                         span=True)
  expect = -np.mean([np.mean(np.log(probs[0, 2, 3, 1:4])), np.mean(np.log(probs[0, 2, 9, 8:10]))])
  np.testing.assert_allclose(float(got), expect, rtol=1e-5)


def test_span_heads_go_past_the_link_and_previous_heads_keys_or_are_refused():
  cfg = ml_collections.ConfigDict(dict(link_heads=1, previous_heads=1, span_heads=1, previous_readout_every=1))
  wide = llama.DecoderConfig.tiny(num_heads=6, num_kv_heads=3, head_dim=8, hidden_size=48)
  assert targets.span_first(wide, cfg) == 4
  targets.check_layer0_heads(wide, cfg)
  with pytest.raises(ValueError, match="span_heads"):
    targets.check_layer0_heads(_model().config, cfg)  # 4 heads over 2 key-value heads: no room past heads 0..3
  cfg.previous_heads = 0
  assert targets.span_first(_model().config, cfg) == 2
  targets.check_layer0_heads(_model().config, cfg)


def test_element_spans_mark_each_elements_last_word_with_its_length():
  pieces = ["<", 'a id="', "26", '">', " Candle", " F", "49", " </a>", "<", 'a id="', "27", '">', " Go", " </a>"]
  links = targets.id_links(list(range(len(pieces))), pieces)
  assert targets.element_spans(links).tolist() == [0] * 6 + [3] + [0] * 7


def test_id_links_point_an_elements_words_at_its_id():
  pieces = ["<", 'a id="', "26", '">', " Office", " hours", " </a>", " $", "5"]
  links = targets.id_links(list(range(len(pieces))), pieces)
  assert links.tolist() == [0, 0, 0, 0, 2, 3, 0, 0, 0]


def _copy_head_model_and_batch():
  """A tiny decoder with a copy head, and `_batch` with slot 6 holding the token at 9 (which slot 8 predicts)."""
  cfg = llama.DecoderConfig.tiny(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                                 intermediate_size=64, vocab_size=64, max_position_embeddings=64, copy_head=8)
  model, batch = llama.init_decoder(cfg, 0), _batch()
  ids = batch["input_ids"]
  ids[0, 6] = ids[0, 9]  # slot 8 predicts the token at 9, which slot 6 also holds: a copy
  batch["targets"] = np.roll(ids, -1, 1)
  batch["reply_source"] = np.zeros_like(ids)
  return model, batch


def _head_targets_only(**weights):
  """The targets' config with every attention head off: the copy head's terms alone, at `weights`."""
  return ml_collections.ConfigDict(dict(weight=1.0, reply_layer=-1, reply_heads=0, link_heads=0, name_layer=0,
                                        name_heads=0, previous_heads=0, readout=False, previous_readout_every=1,
                                        span_heads=0, **weights))


@pytest.mark.slow
def test_the_pointer_target_is_minus_log_the_copy_heads_weight_on_a_source_holding_the_token():
  model, batch = _copy_head_model_and_batch()
  batch["reply_source"][0, 8] = 3  # 9 - 3 = slot 6
  batch["reply_source"][0, 3] = 2  # 4 - 2 = slot 2, which holds another token: not the pointer's
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  hidden, _ = model.hidden_states(batch["input_ids"], segment_ids=batch["segment_ids"])
  plain, seg = model.features(hidden), batch["segment_ids"]
  slots = np.arange(12)
  allowed = (slots[None, :] <= 8) & (np.asarray(seg[0]) == 2)
  scores = model.copy_head.scores(plain[:, 8:9], model.copy_head.key(plain), jnp.asarray(allowed)[None], seg > 0,
                                  layers.segment_positions(seg))
  expect = -float(jax.nn.log_softmax(scores, -1)[0, 0, 6])
  got = targets.pointer_nll(model, hidden, batch["reply_source"], 4, seg, batch["input_ids"], batch["targets"])
  np.testing.assert_allclose(float(got), expect, rtol=1e-5)
  tcfg = _head_targets_only(pointer=0.5)
  total, metrics = targets.pretrain_loss(4, tcfg, dict.fromkeys(targets.FIELDS, 4))(model, batch)
  np.testing.assert_allclose(float(metrics["pointer_attention"]), expect, rtol=1e-5)
  np.testing.assert_allclose(float(total), float(metrics["reply_nll"]) + 0.5 * expect, rtol=1e-5)
  g = nnx.grad(lambda m: targets.pretrain_loss(4, tcfg, dict.fromkeys(targets.FIELDS, 4))(
      m, batch)[0])(model)
  assert float(jnp.abs(g.copy_head.key.kernel.get_value()).sum()) > 0
  assert float(jnp.abs(g.copy_head.gate.kernel.get_value()).sum()) > 0


@pytest.mark.slow
def test_the_gate_target_asks_the_pointer_at_a_copied_token_and_the_vocabulary_at_the_replys_others():
  model, batch = _copy_head_model_and_batch()
  ids = batch["input_ids"]
  batch["reply_source"][0, 8] = 3  # 9 - 3 = slot 6
  batch["reply_source"][0, 9] = 2  # 10 - 2 = slot 8, which holds another token: the vocabulary's
  batch["loss_mask"] = np.zeros_like(ids)
  batch["loss_mask"][0, 7:10] = 1  # slots 7 (no source) and 9: the vocabulary; 8: the pointer
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  hidden, _ = model.hidden_states(batch["input_ids"], segment_ids=batch["segment_ids"])
  gate = np.asarray(hidden[0, 7:10, model.config.hidden_size], np.float64)
  log_sigmoid = lambda x: -np.logaddexp(0.0, -x)
  expect = -(log_sigmoid(gate[0]) + log_sigmoid(-gate[1]) + log_sigmoid(gate[2])) / 3
  np.testing.assert_allclose(float(targets.gate_nll(model, hidden, batch, 4)), expect, rtol=1e-5)
  loss = targets.pretrain_loss(4, _head_targets_only(pointer=0.0, gate=2.0), dict.fromkeys(targets.FIELDS, 4))
  total, metrics = loss(model, batch)
  np.testing.assert_allclose(float(total), float(metrics["reply_nll"]) + 2.0 * expect, rtol=1e-5)
  g = nnx.grad(lambda m: loss(m, batch)[0])(model)
  assert float(jnp.abs(g.copy_head.gate.kernel.get_value()).sum()) > 0
