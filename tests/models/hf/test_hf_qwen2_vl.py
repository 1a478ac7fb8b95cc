"""Qwen2.5-VL against a tiny random `transformers` model: tower features, M-RoPE logits, greedy generate, import."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from jaxagent.models import qwen2_vl
from jaxagent.models.hf import qwen2_vl as hf_qwen2_vl

IMAGE, START, END = 190, 192, 193
VISION = dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=64, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, window_size=16, fullatt_block_indexes=[1, 3])
TEXT = dict(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=0,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
# 8x12 patches: 4x6 merged blocks in windows of 2x2 (16 px / 2 / 4), so windowing splits it; then a 4x4 one.
GRIDS = np.asarray([[1, 8, 12], [1, 4, 4]])


def _rel(a, b):
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def _prompt(grids):
  """Text, then each image as <start> image tokens <end> followed by more text (as the processor writes it)."""
  ids = [5, 6]
  for k, (t, h, w) in enumerate(grids):
    ids += [START] + [IMAGE] * (t * h * w // 4) + [END] + [20 + k, 30 + k]
  return np.asarray([ids + [7]])


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
  torch.manual_seed(0)
  cfg = transformers.Qwen2_5_VLConfig(vision_config=VISION, text_config=TEXT, image_token_id=IMAGE,
                                      video_token_id=191, vision_start_token_id=START, vision_end_token_id=END)
  model = transformers.Qwen2_5_VLForConditionalGeneration(cfg).eval()
  with torch.no_grad():  # larger than the default init so that every part moves the logits
    for name, p in model.named_parameters():
      p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name or "ln_q" in name else 0.15 * torch.randn_like(p))
  path = tmp_path_factory.mktemp("qwen25vl")
  model.save_pretrained(path)
  return model, path


@pytest.fixture(scope="module")
def ours(hf_model):
  return hf_qwen2_vl.load(hf_model[1])


def _pixels(grids, seed=0):
  n = int((grids[:, 0] * grids[:, 1] * grids[:, 2]).sum())
  return np.random.RandomState(seed).randn(n, 3 * 2 * 4 * 4).astype(np.float32)


def _hf_logits(model, ids, pixels, grids):
  with torch.no_grad():
    return model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels),
                 image_grid_thw=torch.from_numpy(grids), mm_token_type_ids=torch.from_numpy((ids == IMAGE).astype(int)),
                 ).logits.numpy()


def test_config_reads_both_layouts(ours):
  cfg = ours[1]
  assert cfg.mrope_section == (2, 3, 3) and cfg.image_token_id == IMAGE and cfg.text.head_dim == 16
  assert cfg.vision.fullatt_block_indexes == (1, 3) and cfg.text.attention_bias
  # The released checkpoints' flat layout: text fields at the top level, rope_scaling with type mrope.
  flat = {**TEXT, "model_type": "qwen2_5_vl", "vision_config": VISION, "image_token_id": IMAGE,
          "video_token_id": 191, "vision_start_token_id": START, "vision_end_token_id": END,
          "rope_theta": 10000.0, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
  del flat["rope_parameters"]
  assert hf_qwen2_vl.config_from_hf(flat) == cfg


@pytest.mark.slow
def test_image_features_match_visual(hf_model, ours):
  ref, model = hf_model[0], ours[0]
  pixels = _pixels(GRIDS)
  lay = qwen2_vl.layout(model.config.vision, GRIDS)
  assert len(np.unique(lay.window_segments)) > 3  # windows really split the first image
  with torch.no_grad():
    want = ref.model.visual(torch.from_numpy(pixels), grid_thw=torch.from_numpy(GRIDS)).pooler_output.numpy()
  got = np.asarray(model.image_features(jnp.asarray(pixels), GRIDS))
  assert got.shape == want.shape == (28, 64)
  assert _rel(got, want) < 1e-4


def test_rope_index_matches_hf(hf_model):
  ref = hf_model[0]
  cfg = hf_qwen2_vl.config_from_dir(hf_model[1])
  ids = _prompt(GRIDS)
  want, want_delta = ref.model.get_rope_index(torch.from_numpy(ids), torch.from_numpy((ids == IMAGE).astype(int)),
                                              image_grid_thw=torch.from_numpy(GRIDS))
  got, delta = qwen2_vl.rope_index(cfg, ids, GRIDS)
  np.testing.assert_array_equal(got, want.numpy())
  np.testing.assert_array_equal(delta, want_delta.numpy()[:, 0])


@pytest.mark.parametrize("n_images", [1, 2])
@pytest.mark.slow
def test_logits_match(hf_model, ours, n_images):
  grids = GRIDS[:n_images]
  ids, pixels = _prompt(grids), _pixels(grids, seed=n_images)
  want = _hf_logits(hf_model[0], ids, pixels, grids)
  got = np.asarray(ours[0](jnp.asarray(ids), jnp.asarray(pixels), grids))
  assert got.shape == want.shape == (1, ids.shape[1], 200)
  err = _rel(got, want)
  print(f"qwen2.5-vl logits, {n_images} image(s): max relative error {err:.2e}")
  assert err < 1e-4


@pytest.mark.slow
def test_greedy_generate_matches_hf(hf_model, ours):
  ids, pixels = _prompt(GRIDS), _pixels(GRIDS, seed=3)
  with torch.no_grad():
    want = hf_model[0].generate(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels),
                                image_grid_thw=torch.from_numpy(GRIDS),
                                mm_token_type_ids=torch.from_numpy((ids == IMAGE).astype(int)),
                                attention_mask=torch.ones_like(torch.from_numpy(ids)), max_new_tokens=5,
                                min_new_tokens=5, do_sample=False)[:, ids.shape[1]:].numpy()
  model = ours[0]
  # Full forwards: each step re-runs the prompt plus what was generated, generated tokens continuing the text
  # positions (rope_index treats them as text after the last image, HF's rope_deltas).
  seq = ids
  for _ in range(5):
    logits = np.asarray(model(jnp.asarray(seq), jnp.asarray(pixels), GRIDS))
    seq = np.concatenate([seq, logits[:, -1].argmax(-1)[:, None]], 1)
  assert len(np.unique(want)) > 1, want  # not one token repeated: the test would not see position mistakes
  np.testing.assert_array_equal(seq[:, ids.shape[1]:], want)
  # The KV-cache path: prompt once, then one token per step from the cache's largest position + 1.
  np.testing.assert_array_equal(qwen2_vl.greedy_generate(model, ids, jnp.asarray(pixels), GRIDS, 5), want)


@pytest.mark.slow
def test_loads_in_memory_spelling(hf_model, ours, tmp_path):
  """transformers-5 in-memory names (`model.visual.*`, `model.language_model.*`) load to the same model."""
  src = hf_model[1]
  tensors = load_file(os.path.join(src, "model.safetensors"))
  renamed = {("model." + k if k.startswith("visual.") else
              "model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
             for k, v in tensors.items()}
  assert any(k.startswith("model.visual.") for k in renamed)
  save_file(renamed, os.path.join(tmp_path, "model.safetensors"), metadata={"format": "pt"})
  shutil.copy(os.path.join(src, "config.json"), tmp_path)
  model, _ = hf_qwen2_vl.load(tmp_path)
  ids, pixels = _prompt(GRIDS[:1]), _pixels(GRIDS[:1])
  a = np.asarray(model(jnp.asarray(ids), jnp.asarray(pixels), GRIDS[:1]))
  b = np.asarray(ours[0](jnp.asarray(ids), jnp.asarray(pixels), GRIDS[:1]))
  np.testing.assert_array_equal(a, b)


def test_export_round_trips_to_transformers(hf_model, ours, tmp_path):
  model, cfg = ours
  hf_qwen2_vl.save_pretrained(model, cfg, tmp_path)
  with open(os.path.join(tmp_path, "config.json")) as f:
    assert hf_qwen2_vl.config_from_hf(json.load(f)) == cfg
  back = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path).eval()
  ids, pixels = _prompt(GRIDS), _pixels(GRIDS)
  assert _rel(_hf_logits(back, ids, pixels, GRIDS), _hf_logits(hf_model[0], ids, pixels, GRIDS)) < 1e-6


@pytest.mark.slow
def test_left_padded_batch_matches_hf(hf_model, ours):
  """Two rows of different lengths, each with its own image, left-padded: positions skip the padding."""
  rows = [_prompt(GRIDS[:1])[0], _prompt(GRIDS[1:])[0]]
  t = max(len(r) for r in rows)
  ids = np.zeros((2, t), np.int64)
  mask = np.zeros((2, t), np.int64)
  for i, r in enumerate(rows):
    ids[i, t - len(r):], mask[i, t - len(r):] = r, 1
  pixels = _pixels(GRIDS, seed=5)
  with torch.no_grad():
    want = hf_model[0](input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                       pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(GRIDS),
                       mm_token_type_ids=torch.from_numpy((ids == IMAGE).astype(int))).logits.numpy()
  got = np.asarray(ours[0](jnp.asarray(ids), jnp.asarray(pixels), GRIDS, attention_mask=jnp.asarray(mask)))
  real = mask.astype(bool)
  err = _rel(got[real], want[real])
  print(f"qwen2.5-vl logits, left-padded batch of 2: max relative error {err:.2e}")
  assert err < 1e-4
