"""HF parity for the vision towers and LLaVA: tiny random `transformers` models, saved, loaded by us, compared."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file

from jaxagent import sharding
from jaxagent.models import sampler, vlm
from jaxagent.models.hf import clip as hf_clip
from jaxagent.models.hf import io
from jaxagent.models.hf import llava as hf_llava
from jaxagent.models.hf import siglip as hf_siglip

REL_TOL = 1e-4
TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, image_size=32,
             patch_size=8)


def _randomise(model, seed=0):
  """HF zero-initialises biases and ones norms; randomise so that every tensor matters."""
  torch.manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.normal_(0.0, 0.15)
  return model.eval()


def _rel_err(ours, theirs):
  theirs = np.asarray(theirs)
  return float(np.max(np.abs(np.asarray(ours) - theirs)) / np.max(np.abs(theirs)))


def _pixels(n, size, seed=0):
  return np.random.RandomState(seed).randn(n, size, size, 3).astype(np.float32)


def _hf_vision(hf_model, pixels):
  with torch.no_grad():
    return hf_model(torch.from_numpy(pixels.transpose(0, 3, 1, 2)), output_hidden_states=True)


encode = nnx.jit(lambda tower, x: tower.encode(x, return_hidden_states=True))
features = nnx.jit(lambda tower, x: tower(x))


@pytest.fixture(scope="module")
def clip_ckpt(tmp_path_factory):
  hf_model = _randomise(transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**TOWER)))
  path = tmp_path_factory.mktemp("clip")
  hf_model.save_pretrained(path)
  return hf_model, path


@pytest.fixture(scope="module")
def siglip_ckpt(tmp_path_factory):
  hf_model = _randomise(transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**TOWER)), seed=1)
  path = tmp_path_factory.mktemp("siglip")
  hf_model.save_pretrained(path)
  return hf_model, path


@pytest.mark.parametrize("select_layer, select_feature", [(-2, "patch"), (-1, "cls_patch"), (1, "patch")])
def test_clip_tower_parity(clip_ckpt, select_layer, select_feature):
  hf_model, path = clip_ckpt
  tower, cfg = hf_clip.load_pretrained(path, select_layer=select_layer, select_feature=select_feature)
  x = _pixels(2, cfg.image_size)
  ref = _hf_vision(hf_model, x)
  want = ref.hidden_states[select_layer].numpy()
  if select_feature == "patch":
    want = want[:, 1:]
  assert _rel_err(features(tower, x), want) < REL_TOL
  full = encode(tower, x)
  for ours, theirs in zip(full.hidden_states, ref.hidden_states, strict=True):
    assert _rel_err(ours, theirs) < REL_TOL
  assert _rel_err(full.pooled, ref.pooler_output) < REL_TOL


def test_siglip_tower_parity(siglip_ckpt):
  hf_model, path = siglip_ckpt
  tower, cfg = hf_siglip.load_pretrained(path)
  assert cfg.pool_head and not cfg.class_token
  x = _pixels(3, cfg.image_size, seed=2)
  ref = _hf_vision(hf_model, x)
  full = encode(tower, x)
  assert _rel_err(full.last_hidden_state, ref.last_hidden_state) < REL_TOL
  assert _rel_err(full.pooled, ref.pooler_output) < REL_TOL
  for ours, theirs in zip(full.hidden_states, ref.hidden_states, strict=True):
    assert _rel_err(ours, theirs) < REL_TOL
  assert _rel_err(features(tower, x), ref.last_hidden_state) < REL_TOL


def test_siglip_tower_without_head_ignores_the_head(siglip_ckpt):
  hf_model, path = siglip_ckpt
  tower, cfg = hf_siglip.load_pretrained(path, pool_head=False, select_layer=-2)
  x = _pixels(1, cfg.image_size)
  assert tower.head is None
  assert _rel_err(features(tower, x), _hf_vision(hf_model, x).hidden_states[-2]) < REL_TOL


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_export_reloads_in_transformers_with_identical_tensors(family, clip_ckpt, siglip_ckpt, tmp_path):
  hf_model, path = clip_ckpt if family == "clip" else siglip_ckpt
  lib = hf_clip if family == "clip" else hf_siglip
  tower, cfg = lib.load_pretrained(path)
  lib.save_pretrained(tower, cfg, tmp_path)
  cls = transformers.CLIPVisionModel if family == "clip" else transformers.SiglipVisionModel
  reloaded = cls.from_pretrained(tmp_path).eval()
  want = hf_model.state_dict()
  got = reloaded.state_dict()
  assert set(got) == set(want)
  for key in want:
    np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=key)
  # ... and it runs.
  x = _pixels(1, cfg.image_size)
  np.testing.assert_array_equal(_hf_vision(reloaded, x).last_hidden_state.numpy(),
                                _hf_vision(hf_model, x).last_hidden_state.numpy())


def test_load_onto_an_8_device_mesh(clip_ckpt):
  hf_model, path = clip_ckpt
  mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 4})
  tower, cfg = hf_clip.load_pretrained(path, mesh, select_layer=-2)
  kernel = tower.blocks[0].attn.q.kernel.get_value()
  assert kernel.sharding.spec == sharding.logical_to_spec(("vision_embed", "vision_heads", "head_dim"),
                                                          kernel.shape, mesh)
  assert len(kernel.sharding.device_set) == 8
  x = _pixels(8, cfg.image_size)
  with jax.set_mesh(mesh):
    got = features(tower, jnp.asarray(x))
  assert _rel_err(got, _hf_vision(hf_model, x).hidden_states[-2][:, 1:]) < REL_TOL


def test_mismatched_and_missing_tensors_are_named(clip_ckpt, tmp_path):
  _, path = clip_ckpt
  tensors = load_file(str(path / "model.safetensors"))
  key = next(k for k in tensors if k.endswith("layers.1.mlp.fc1.weight"))
  broken = dict(tensors)
  broken[key] = np.zeros((3, 5), np.float32)
  del broken[next(k for k in tensors if k.endswith("post_layernorm.bias"))]
  io.write_safetensors(broken, tmp_path)
  (tmp_path / "config.json").write_text((path / "config.json").read_text())
  with pytest.raises(io.CheckpointMismatchError) as err:
    hf_clip.load_pretrained(tmp_path)
  msg = str(err.value)
  assert key in msg and "(3, 5)" in msg and "(64, 32)" in msg
  assert "post_layernorm.bias" in msg and "(32,)" in msg


def test_reads_vision_model_prefixed_checkpoints(clip_ckpt, tmp_path):
  """`CLIPModel` saves and transformers 4 name the tower `vision_model.*`; text-tower tensors are ignored."""
  hf_model, path = clip_ckpt
  tensors = load_file(str(path / "model.safetensors"))
  prefixed = {k if k.startswith("vision_model.") else "vision_model." + k: v for k, v in tensors.items()}
  prefixed["text_model.embeddings.token_embedding.weight"] = np.zeros((10, 4), np.float32)
  io.write_safetensors(prefixed, tmp_path)
  (tmp_path / "config.json").write_text((path / "config.json").read_text())
  tower, cfg = hf_clip.load_pretrained(tmp_path, select_layer=-2)
  x = _pixels(1, cfg.image_size)
  assert _rel_err(features(tower, x), _hf_vision(hf_model, x).hidden_states[-2][:, 1:]) < REL_TOL


# --- LLaVA ----------------------------------------------------------------------------------------------------

IMAGE_TOKEN = 99
GEN_CONFIG = dict(max_new_tokens=20, temperature=0.0, eos_ids=(2,), pad_id=0)


@pytest.fixture(scope="module")
def llava_ckpt(tmp_path_factory):
  vision = transformers.CLIPVisionConfig(**TOWER)
  text = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=100, max_position_embeddings=128,
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
  config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN,
                                    image_seq_length=16, vision_feature_layer=-2)
  hf_model = _randomise(transformers.LlavaForConditionalGeneration(config), seed=3)
  path = tmp_path_factory.mktemp("llava")
  hf_model.save_pretrained(path)
  _tiny_processor().save_pretrained(path)
  model, cfg = hf_llava.load_pretrained(path)
  return hf_model, path, model, cfg


def _tiny_processor():
  """A LlavaProcessor built here: a word-level tokenizer with `<image>` as id 99 and a CLIP image processor."""
  import tokenizers
  vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(95)] + ["<image>"])}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tokenizer = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
      extra_special_tokens={"image_token": "<image>"})
  images = transformers.CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
  return transformers.LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=TOWER["patch_size"],
                                     vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                     image_token="<image>")


def _llava_batch(seed=0):
  """Row 0: two images and right padding; row 1: one image. Image tokens sit in blocks of 16."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, IMAGE_TOKEN, size=(2, 40))
  ids[0, 3:19] = IMAGE_TOKEN
  ids[0, 21:37] = IMAGE_TOKEN
  ids[1, 5:21] = IMAGE_TOKEN
  mask = np.ones((2, 40), bool)
  mask[0, 38:] = False
  ids[0, 38:] = 0
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  return ids, mask, positions, _pixels(3, TOWER["image_size"], seed=seed)


def test_llava_config_and_layout(llava_ckpt):
  _, _, model, cfg = llava_ckpt
  assert cfg.image_token_id == IMAGE_TOKEN and cfg.num_image_tokens == 16
  assert cfg.vision.select_layer == -2 and cfg.vision.select_feature == "patch"
  assert model.projector.linear_1.kernel.get_value().shape == (32, 32)


def test_llava_logits_parity_with_one_and_two_images_and_padding(llava_ckpt):
  hf_model, _, model, cfg = llava_ckpt
  ids, mask, positions, pixels = _llava_batch()
  with torch.no_grad():
    ref = hf_model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2)),
                   attention_mask=torch.from_numpy(mask).long(), position_ids=torch.from_numpy(positions))
  forward = nnx.jit(lambda m, i, x, a, p: m(i, x, attention_mask=a, positions=p))
  ours = np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(pixels), jnp.asarray(mask), jnp.asarray(positions)))
  assert _rel_err(ours[mask], ref.logits.numpy()[mask]) < REL_TOL


def test_llava_greedy_decoding_matches_hf_generate(llava_ckpt):
  hf_model, _, model, cfg = llava_ckpt
  rng = np.random.default_rng(1)
  ids = rng.integers(3, IMAGE_TOKEN, size=(2, 24))
  mask = np.ones((2, 24), bool)
  ids[0, 2:18] = IMAGE_TOKEN
  ids[1, :6], mask[1, :6] = 0, False  # left padding, as HF generate wants
  ids[1, 7:23] = IMAGE_TOKEN
  pixels = _pixels(2, TOWER["image_size"], seed=4)
  with torch.no_grad():
    ref = hf_model.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(),
                            pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2)), do_sample=False,
                            max_new_tokens=20, eos_token_id=2, pad_token_id=0)[:, ids.shape[1]:].numpy()
  out = vlm.sample(model, ids, mask, pixels, sampler.SamplingConfig(**GEN_CONFIG))
  tokens = np.asarray(out.tokens)
  assert ref.shape[1] == 20 or (ref == 2).any()
  np.testing.assert_array_equal(tokens[:, :ref.shape[1]], ref)
  assert np.all(np.isfinite(np.asarray(out.logprobs))) and np.all(np.asarray(out.logprobs) <= 0)


def test_llava_export_reloads_in_transformers(llava_ckpt, tmp_path):
  hf_model, path, model, cfg = llava_ckpt
  hf_llava.save_pretrained(model, cfg, tmp_path, processor_from=path)
  reloaded = transformers.LlavaForConditionalGeneration.from_pretrained(tmp_path).eval()
  want, got = hf_model.state_dict(), reloaded.state_dict()
  assert set(got) == set(want)
  for key in want:
    np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=key)
  assert reloaded.config.vision_feature_layer == -2 and reloaded.config.image_token_id == IMAGE_TOKEN
  ids, mask, positions, pixels = _llava_batch(seed=2)
  args = dict(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2)),
              attention_mask=torch.from_numpy(mask).long(), position_ids=torch.from_numpy(positions))
  with torch.no_grad():
    np.testing.assert_array_equal(reloaded(**args).logits.numpy(), hf_model(**args).logits.numpy())
  # The processor travels with the weights; its token expansion and image settings agree with ours.
  processor = transformers.AutoProcessor.from_pretrained(tmp_path)
  images = [np.random.RandomState(k).randint(0, 256, shape).astype(np.uint8)
            for k, shape in enumerate([(45, 60, 3), (70, 33, 3)])]
  inputs = processor(text=["w1 <image> w2 w3 <image> w4"], images=images, return_tensors="np")
  ids = inputs["input_ids"]
  assert int(np.sum(ids == cfg.image_token_id)) == 2 * cfg.num_image_tokens
  pixels = hf_llava.image_preprocessing(tmp_path)(images)
  np.testing.assert_allclose(pixels, inputs["pixel_values"].transpose(0, 2, 3, 1), atol=1e-5)
  with torch.no_grad():
    ref = hf_model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(inputs["pixel_values"])).logits
  ours = nnx.jit(lambda m, i, x: m(i, x))(model, jnp.asarray(ids), jnp.asarray(pixels))
  assert _rel_err(ours, ref.numpy()) < REL_TOL


def test_llava_loads_onto_an_8_device_mesh(llava_ckpt):
  hf_model, path, model, cfg = llava_ckpt
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  sharded, _ = hf_llava.load_pretrained(path, mesh)
  kernel = sharded.projector.linear_1.kernel.get_value()
  assert kernel.sharding.spec == sharding.logical_to_spec(("vision_embed", "mlp"), kernel.shape, mesh)
  ids, mask, positions, pixels = _llava_batch()
  forward = nnx.jit(lambda m, i, x, a: m(i, x, attention_mask=a))
  expected = np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(pixels), jnp.asarray(mask)))
  with jax.set_mesh(mesh):
    got = np.asarray(forward(sharded, jnp.asarray(ids), jnp.asarray(pixels), jnp.asarray(mask)))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_llava_from_pretrained_parts_joins_a_tower_and_a_decoder(clip_ckpt, tmp_path):
  """LLaVA's stage-1 start: pretrained CLIP + pretrained Llama + fresh projector; exports as a LLaVA."""
  hf_tower, tower_path = clip_ckpt
  text = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=50, max_position_embeddings=64)
  hf_text = _randomise(transformers.LlamaForCausalLM(text), seed=5)
  hf_text.save_pretrained(tmp_path / "text")
  model, cfg = hf_llava.from_pretrained_parts(tower_path, tmp_path / "text", image_token_id=49)
  assert cfg.vision.select_layer == -2 and cfg.text.num_layers == 1 and cfg.num_image_tokens == 16
  x = _pixels(1, cfg.vision.image_size)
  assert _rel_err(features(model.vision_tower, x), _hf_vision(hf_tower, x).hidden_states[-2][:, 1:]) < REL_TOL
  ids = np.arange(1, 11)[None]
  with torch.no_grad():
    want = hf_text(torch.from_numpy(ids)).logits.numpy()
  assert _rel_err(model(jnp.asarray(ids)), want) < REL_TOL
  hf_llava.save_pretrained(model, cfg, tmp_path / "llava")
  llava = transformers.LlavaForConditionalGeneration.from_pretrained(tmp_path / "llava").eval()
  np.testing.assert_array_equal(llava.model.multi_modal_projector.linear_1.weight.detach().numpy(),
                                np.asarray(model.projector.linear_1.kernel.get_value()).T)
