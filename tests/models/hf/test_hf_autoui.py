"""AutoUI (DigiRL's and Digi-Q's actor) against transformers' T5 with DigiRL's image fusion transcribed.

`T5ForMultimodalGeneration` lives in DigiRL's repository (`digirl/models/model.py`), not in transformers; the
reference below is transformers' `T5ForConditionalGeneration` with that file's three extra modules and its
forward's fusion, line for line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from jaxagent.models import autoui, t5
from jaxagent.models.hf import autoui as hf_autoui

REL_TOL = 1e-4
IMG_DIM = 24


class T5ForMultimodalGeneration(transformers.T5ForConditionalGeneration):
  """DigiRL's model: image_dense, a one-head MultiheadAttention, a sigmoid gate after the encoder."""

  def __init__(self, config, img_dim=IMG_DIM):
    super().__init__(config)
    d = config.d_model
    self.image_dense = torch.nn.Linear(img_dim, d)
    self.mha_layer = torch.nn.MultiheadAttention(embed_dim=d, kdim=d, vdim=d, num_heads=1, batch_first=True)
    self.gate_dense = torch.nn.Linear(2 * d, d)

  def fused(self, input_ids, attention_mask, image_ids):
    hidden_states = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
    image_embedding = self.image_dense(image_ids)
    if len(image_embedding.size()) == 2:
      image_embedding = image_embedding.unsqueeze(1)
    image_att, _ = self.mha_layer(hidden_states, image_embedding, image_embedding)
    merge = torch.cat([hidden_states, image_att], dim=-1)
    gate = torch.sigmoid(self.gate_dense(merge))
    return (1 - gate) * hidden_states + gate * image_att

  def logits(self, input_ids, attention_mask, image_ids, decoder_input_ids):
    hidden = self.fused(input_ids, attention_mask, image_ids)
    seq = self.decoder(input_ids=decoder_input_ids, encoder_hidden_states=hidden,
                       encoder_attention_mask=attention_mask)[0]
    if self.config.tie_word_embeddings:
      seq = seq * (self.config.d_model ** -0.5)
    return self.lm_head(seq)


def _config(**kw):
  return transformers.T5Config(**{**dict(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                          num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                                          relative_attention_max_distance=16, feed_forward_proj="gated-gelu",
                                          tie_word_embeddings=False, dropout_rate=0.0, decoder_start_token_id=0,
                                          pad_token_id=0, eos_token_id=1), **kw})


def _save(tmp_path_factory, name, **kw):
  torch.manual_seed(0)
  model = T5ForMultimodalGeneration(_config(**kw))
  with torch.no_grad():
    for p in model.parameters():
      p.normal_(0.0, 0.3)
  path = tmp_path_factory.mktemp(name)
  model.eval().save_pretrained(path)
  return model, path


@pytest.fixture(scope="module", params=["gated-gelu", "relu-tied"])
def ckpt(request, tmp_path_factory):
  kw = {"feed_forward_proj": "relu", "tie_word_embeddings": True} if request.param == "relu-tied" else {}
  return _save(tmp_path_factory, request.param, **kw)


def _inputs(seed=0, b=2, s=21):
  rng = np.random.RandomState(seed)
  ids = rng.randint(2, 96, (b, s))
  mask = np.ones((b, s), np.int64)
  mask[1, 15:] = 0  # a padded row: the encoder and cross-attention must ignore its tail
  return ids, mask, rng.randn(b, IMG_DIM).astype(np.float32)


def _rel(ours, theirs):
  return float(np.max(np.abs(np.asarray(ours) - theirs)) / np.max(np.abs(theirs)))


@pytest.mark.slow
def test_fused_memory_and_logits_match_the_original(ckpt):
  ref, path = ckpt
  model, cfg = hf_autoui.load_pretrained(path)
  assert cfg.img_dim == IMG_DIM
  ids, mask, image = _inputs()
  dec = np.random.RandomState(1).randint(2, 96, (2, 19))  # > max_distance/2: log-spaced buckets are used
  dec[:, 0] = 0
  with torch.no_grad():
    want_mem = ref.fused(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(image)).numpy()
    want = ref.logits(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(image),
                      torch.from_numpy(dec)).numpy()
  mem = model.encode(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(image))
  assert _rel(mem[0], want_mem[0]) < REL_TOL and _rel(mem[1, :15], want_mem[1, :15]) < REL_TOL
  logits = model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(image), jnp.asarray(dec))
  assert _rel(logits, want) < REL_TOL


@pytest.mark.slow
def test_greedy_generation_with_the_cache_matches_the_original(ckpt):
  ref, path = ckpt
  model, _ = hf_autoui.load_pretrained(path)
  ids, mask, image = _inputs(seed=2)
  with torch.no_grad():
    memory = ref.fused(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(image))
    dec = torch.zeros((2, 1), dtype=torch.long)
    for _ in range(8):  # greedy decoding by full recomputation: the reference for our cached steps
      seq = ref.decoder(input_ids=dec, encoder_hidden_states=memory, encoder_attention_mask=torch.from_numpy(mask))[0]
      if ref.config.tie_word_embeddings:
        seq = seq * ref.config.d_model ** -0.5
      dec = torch.cat([dec, ref.lm_head(seq)[:, -1:].argmax(-1)], 1)
  ours = nnx.jit(lambda m, i, a, x: m.generate(i, a, x, 8), static_argnums=())(
      model, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(image))
  assert np.asarray(ours).tolist() == dec[:, 1:].numpy().tolist()


@pytest.mark.slow
def test_export_round_trips_and_a_plain_t5_loads(ckpt, tmp_path):
  ref, path = ckpt
  model, cfg = hf_autoui.load_pretrained(path)
  hf_autoui.save_pretrained(model, cfg, tmp_path / "out")
  again = T5ForMultimodalGeneration.from_pretrained(tmp_path / "out", img_dim=cfg.img_dim).eval()
  ids, mask, image = _inputs(seed=3)
  dec = np.zeros((2, 4), np.int64)
  args = [torch.from_numpy(x) for x in (ids, mask, image, dec)]
  with torch.no_grad():
    np.testing.assert_allclose(again.logits(*args).numpy(), ref.logits(*args).numpy(), rtol=0, atol=1e-5)
  t5_dir = tmp_path / "t5"
  state = {k: v for k, v in ref.state_dict().items() if not k.startswith(("image_dense", "mha_layer", "gate_dense"))}
  base = transformers.T5ForConditionalGeneration(ref.config)
  base.load_state_dict(state)
  base.save_pretrained(t5_dir)
  plain, _ = hf_autoui.load_t5(t5_dir)
  hidden = plain.encode(jnp.asarray(ids), jnp.asarray(mask))
  with torch.no_grad():
    want = ref.encoder(input_ids=args[0], attention_mask=args[1])[0].numpy()
  assert _rel(hidden[0], want[0]) < REL_TOL


def test_relative_buckets_follow_transformers():
  rel = np.arange(-40, 41)[None]
  for bidirectional in (True, False):
    want = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
        torch.from_numpy(rel), bidirectional=bidirectional, num_buckets=32, max_distance=128).numpy()
    ours = t5.relative_buckets(jnp.asarray(rel), bidirectional, 32, 128)
    np.testing.assert_array_equal(np.asarray(ours), want)
