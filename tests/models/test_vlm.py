"""The VLM: image features land at their image tokens, any number of images per row, and the tiny one learns."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxagent import sharding
from jaxagent.models import vlm

VOCAB = 64
IMG = VOCAB - 1


@pytest.fixture(scope="module")
def model():
  return vlm.init_vlm(vlm.VLMConfig.tiny(VOCAB), seed=0)


def _batch(cfg, seed=0):
  """Row 0: text, image A, text, image B, text. Row 1: image C then text and right padding. Images [A, B, C]."""
  p = cfg.num_image_tokens
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, IMG, size=(2, 2 * p + 8)).astype(np.int32)
  starts = {0: (2, p + 5), 1: (0,)}
  for row, blocks in starts.items():
    for s in blocks:
      ids[row, s:s + p] = IMG
  mask = np.ones(ids.shape, bool)
  mask[1, p + 4:] = False
  ids[1, p + 4:] = 0
  images = np.asarray(jax.random.normal(jax.random.key(seed), (3, cfg.vision.image_size, cfg.vision.image_size, 3)))
  return ids, mask, images, starts


forward = nnx.jit(lambda m, ids, images, mask: m(ids, images, attention_mask=mask))
embed = nnx.jit(lambda m, ids, images: m.embed(ids, images))


def test_tiny_config_follows_llava_and_the_tokenizer():
  cfg = vlm.VLMConfig.tiny(300)
  assert cfg.image_token_id == 299 and cfg.text.vocab_size == 300
  assert cfg.num_image_tokens == (64 // 16) ** 2
  assert cfg.vision.select_layer == -2
  with pytest.raises(ValueError, match="VLMConfig.image_token_id=300"):
    vlm.VLMConfig.tiny(300, image_token_id=300)


@pytest.mark.slow
def test_kth_image_block_takes_the_kth_image(model):
  cfg = model.config
  ids, _, images, starts = _batch(cfg)
  merged = np.asarray(embed(model, jnp.asarray(ids), jnp.asarray(images)))
  feats = np.asarray(nnx.jit(lambda m, x: m.image_features(x))(model, jnp.asarray(images)))
  text = np.asarray(model.decoder.embed(jnp.asarray(ids)))
  blocks = [(row, s) for row in (0, 1) for s in starts[row]]
  for k, (row, s) in enumerate(blocks):
    np.testing.assert_allclose(merged[row, s:s + cfg.num_image_tokens], feats[k], rtol=1e-5, atol=1e-6)
  is_text = ids != IMG
  np.testing.assert_array_equal(merged[is_text], text[is_text])


def test_changing_one_image_changes_only_what_follows_it(model):
  cfg = model.config
  ids, mask, images, starts = _batch(cfg)
  base = np.asarray(forward(model, ids, images, mask))
  changed = images.copy()
  changed[1] = -changed[1]  # image B: the second block of row 0
  out = np.asarray(forward(model, ids, changed, mask))
  first = starts[0][1]
  np.testing.assert_array_equal(out[0, :first], base[0, :first])
  np.testing.assert_array_equal(out[1], base[1])
  assert np.all(np.abs(out[0, first:] - base[0, first:]).max(-1) > 1e-6)


def test_trailing_padding_images_are_ignored_and_too_few_are_rejected(model):
  cfg = model.config
  ids, mask, images, _ = _batch(cfg)
  padded = np.concatenate([images, np.zeros_like(images[:2])])
  # Same maths at another batch shape of the tower: equal up to float rounding.
  np.testing.assert_allclose(forward(model, ids, padded, mask), forward(model, ids, images, mask), atol=1e-5)
  with pytest.raises(ValueError, match=r"48 image tokens .* 2 images of 16 tokens"):
    model(jnp.asarray(ids), jnp.asarray(images[:2]), attention_mask=mask)
  with pytest.raises(ValueError, match="expand every <image> placeholder"):
    model(jnp.asarray(ids[:, :-4]).at[0, 2].set(5), jnp.asarray(images), attention_mask=mask[:, :-4])


@pytest.mark.slow
def test_text_only_batches_run_the_decoder_alone(model):
  rng = np.random.default_rng(3)
  ids = jnp.asarray(rng.integers(1, IMG, size=(2, 9)), jnp.int32)
  logits, hidden = model(ids, None, return_hidden=True)
  np.testing.assert_array_equal(logits, model.decoder(ids))
  assert hidden.shape == (2, 9, model.config.text.hidden_size)


def test_every_param_is_named():
  abstract = nnx.eval_shape(lambda: vlm.VLM(vlm.VLMConfig.tiny(VOCAB), rngs=nnx.Rngs(0)))
  rules = dict(sharding.RULES)
  params = nnx.state(abstract, nnx.Param)
  leaves = jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda v: isinstance(v, nnx.Variable))
  assert any("projector" in str(path) for path, _ in leaves)
  for path, var in leaves:
    axes = var.get_metadata().get("logical_axes")
    assert axes is not None and len(axes) == len(var.get_value().shape), path
    assert all(a is None or a in rules for a in axes), (path, axes)


@pytest.mark.slow
def test_tiny_vlm_learns_to_describe_its_images():
  """A few Adam steps on a fixed batch: the next-token loss on the text after the images falls."""
  cfg = vlm.VLMConfig.tiny(VOCAB)
  model = vlm.init_vlm(cfg, seed=1)
  ids, mask, images, _ = _batch(cfg, seed=5)
  optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
  targets, weights = ids[:, 1:], (mask[:, 1:] & (ids[:, 1:] != IMG)).astype(np.float32)

  def loss_fn(m):
    logits = m(jnp.asarray(ids), jnp.asarray(images), attention_mask=mask)[:, :-1]
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(nll * weights) / jnp.sum(weights)

  @nnx.jit
  def step(m, opt):
    loss, grads = nnx.value_and_grad(loss_fn)(m)
    opt.update(m, grads)
    return loss

  losses = [float(step(model, optimizer)) for _ in range(12)]
  assert np.isfinite(losses).all()
  assert losses[-1] < 0.7 * losses[0], losses
