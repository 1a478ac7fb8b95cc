"""ViT towers: config checks, layer/feature selection, sharding metadata, preprocessing against HF's processors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxagent import sharding
from jaxagent.models import vit


features = nnx.jit(lambda tower, x: tower(x))
encode = nnx.jit(lambda tower, x: tower.encode(x, return_hidden_states=True))


def _images(n=2, size=64, seed=0):
  return jnp.asarray(np.random.RandomState(seed).randn(n, size, size, 3).astype(np.float32))


@pytest.mark.parametrize("kwargs, field", [
    (dict(image_size=60), "image_size"),
    (dict(num_heads=5), "num_heads"),
    (dict(act="relu6"), "act"),
    (dict(select_feature="cls"), "select_feature"),
    (dict(select_layer=7), "select_layer"),
])
def test_config_errors_name_the_field(kwargs, field):
  with pytest.raises(ValueError, match=f"ViTConfig.{field}"):
    vit.ViTConfig.tiny("clip", **kwargs)


def test_siglip_rejects_class_token_features():
  with pytest.raises(ValueError, match="select_feature.*SigLIP"):
    vit.ViTConfig.tiny("siglip", select_feature="cls_patch")


def test_clip_select_layer_and_feature():
  cfg = vit.ViTConfig.tiny("clip", depth=3, select_layer=-2)
  tower = vit.VisionTower(cfg, rngs=nnx.Rngs(0))
  x = _images()
  hidden = encode(tower, x).hidden_states
  assert len(hidden) == cfg.depth + 1
  feats = features(tower, x)
  assert feats.shape == (2, cfg.num_patches, cfg.width) == (2, cfg.num_features, cfg.width)
  np.testing.assert_allclose(feats, hidden[-2][:, 1:], rtol=1e-6, atol=1e-6)

  # The last block is never run for select_layer=-2: scrambling it changes nothing.
  last = tower.blocks[-1].mlp.fc1.kernel
  last.set_value(last.get_value() * 100.0)
  np.testing.assert_array_equal(features(tower, x), feats)

  keep = vit.VisionTower(vit.ViTConfig.tiny("clip", depth=3, select_layer=-2, select_feature="cls_patch"),
                         rngs=nnx.Rngs(0))
  with_cls = features(keep, x)
  assert with_cls.shape == (2, cfg.num_patches + 1, cfg.width)
  np.testing.assert_allclose(with_cls[:, 1:], feats, rtol=1e-6, atol=1e-6)


def test_siglip_tower_shapes_and_pooling():
  cfg = vit.ViTConfig.tiny("siglip", pool_head=True)
  tower = vit.VisionTower(cfg, rngs=nnx.Rngs(1))
  x = _images(3)
  out = encode(tower, x)
  assert out.last_hidden_state.shape == (3, cfg.num_patches, cfg.width)
  assert out.pooled.shape == (3, cfg.width)
  # Default selection (None) is last_hidden_state, which for SigLIP includes the post-layernorm.
  np.testing.assert_allclose(features(tower, x), out.last_hidden_state, rtol=1e-6, atol=1e-6)
  normed = out.last_hidden_state
  np.testing.assert_allclose(normed.mean(-1), tower.post_norm.bias.get_value().mean(), atol=1e-1)


def test_images_of_the_wrong_size_are_rejected():
  tower = vit.VisionTower(vit.ViTConfig.tiny("clip"), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"images must be \[N, 64, 64, 3\]"):
    tower(jnp.zeros((1, 3, 64, 64)))


@pytest.mark.slow
def test_remat_gives_the_same_features_and_grads():
  x = _images(1)
  towers = [vit.VisionTower(vit.ViTConfig.tiny("clip", remat=r), rngs=nnx.Rngs(0)) for r in (False, True)]
  loss = lambda t: jnp.sum(t(x) ** 2)
  grads = [nnx.jit(nnx.grad(loss))(t) for t in towers]
  np.testing.assert_allclose(features(towers[0], x), features(towers[1], x), rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads[0], grads[1])


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_every_param_is_named_and_shards_on_8_devices(family):
  cfg = vit.ViTConfig.tiny(family, pool_head=family == "siglip")
  tower = vit.VisionTower(cfg, rngs=nnx.Rngs(0))
  params = nnx.state(tower, nnx.Param)
  rules = dict(sharding.RULES)
  for path, var in jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda v: isinstance(v, nnx.Variable)):
    axes = var.get_metadata().get("logical_axes")
    assert axes is not None and len(axes) == var.get_value().ndim, path
    assert all(a is None or a in rules for a in axes), (path, axes)

  mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 4})
  specs = sharding.state_specs(params, mesh)
  assert specs["blocks"][0]["attn"]["q"]["kernel"] == P("fsdp", "tensor")
  assert specs["blocks"][0]["mlp"]["fc2"]["kernel"] == P("tensor", "fsdp")

  x = _images(8)
  expected = features(tower, x)
  graphdef, state = nnx.split(tower)
  state = jax.device_put(state, sharding.state_shardings(state, mesh))
  assert state["blocks"][0]["attn"]["q"]["kernel"].get_value().sharding.spec == P("fsdp", "tensor")
  with jax.set_mesh(mesh):
    got = jax.jit(lambda s, im: nnx.merge(graphdef, s)(im))(state, jax.device_put(x, sharding.batch_sharding(mesh, 4)))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# --- preprocessing --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(50, 70, 3), (90, 41, 3), (64, 64, 3)])
def test_preprocessing_matches_hf_processors(shape):
  transformers = pytest.importorskip("transformers")
  img = np.random.RandomState(sum(shape)).randint(0, 256, shape).astype(np.uint8)
  ref = transformers.CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
  want = ref(images=[img], return_tensors="np")["pixel_values"].transpose(0, 2, 3, 1)
  np.testing.assert_allclose(vit.ImagePreprocessing.clip(32)([img]), want, atol=1e-5)
  ref = transformers.SiglipImageProcessorPil(size={"height": 32, "width": 32})
  want = ref(images=[img], return_tensors="np")["pixel_values"].transpose(0, 2, 3, 1)
  np.testing.assert_allclose(vit.ImagePreprocessing.siglip(32)([img]), want, atol=1e-5)


def test_pad_to_square_keeps_the_whole_image():
  from PIL import Image
  img = np.full((20, 40, 3), 255, np.uint8)  # a white, wide screenshot
  pre = vit.ImagePreprocessing.clip(40, pad_to_square=True)
  out = pre([img])[0]
  assert out.shape == (40, 40, 3)
  white = (1.0 - np.asarray(vit.OPENAI_CLIP_MEAN)) / np.asarray(vit.OPENAI_CLIP_STD)
  np.testing.assert_allclose(out[20, 20], white, atol=1e-5)  # the image, centred
  np.testing.assert_allclose(out[0, 20], (np.floor(np.asarray(vit.OPENAI_CLIP_MEAN) * 255) / 255 -
                                          vit.OPENAI_CLIP_MEAN) / vit.OPENAI_CLIP_STD, atol=1e-5)  # mean padding
  assert pre([Image.fromarray(img)]).shape == (1, 40, 40, 3)


def test_preprocessing_rejects_bad_arrays():
  with pytest.raises(ValueError, match="uint8"):
    vit.ImagePreprocessing.clip(32)([np.zeros((8, 8, 3), np.float32)])
