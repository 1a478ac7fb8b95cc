"""Qwen2.5-VL through `config.model.hf_checkpoint`: preprocessing, a training sample's tokens and M-RoPE positions,
`finetune`, and acting through `ModelPolicy`, each against `transformers` on a tiny random checkpoint.

No Qwen tokenizer is available offline, so the checkpoint's tokenizer is a byte-level BPE trained here on the
agent corpus with Qwen2.5-VL's special tokens (`<|im_start|>`, `<|im_end|>`, `<|vision_start|>`, `<|image_pad|>`,
`<|vision_end|>`, ...) and Qwen2.5-VL-Instruct's chat template.
"""

import json
import os

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from configs import il as il_config
from jaxagent import models
from jaxagent.data import conversation, pipeline
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.models import qwen_vl

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]
# Qwen2.5-VL-Instruct's chat_template.json.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}")
VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=64, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, window_size=16, fullatt_block_indexes=[1])
IMAGE_SIZE = 30  # config.data.image_size: rounds to 32 px, a grid of 8x8 patches, 16 image tokens


def _train_tokenizer(out_dir):
  from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers
  from jaxagent.data import synthetic_conversations
  tok = Tokenizer(tok_models.BPE(unk_token=None))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIALS, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(synthetic_conversations.corpus(), trainer=trainer)
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=SPECIALS,
      chat_template=CHAT_TEMPLATE, padding_side="right")
  fast.save_pretrained(out_dir)
  return fast


def _image_processor():
  """HF's PIL image processor at our tiny patch sizes, asked for exactly our 32 px square."""
  return transformers.Qwen2VLImageProcessorPil(patch_size=4, temporal_patch_size=2, merge_size=2,
                                               size={"shortest_edge": 32 * 32, "longest_edge": 32 * 32})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """(HF model, its directory): a tiny random Qwen2.5-VL saved with transformers, with tokenizer and processor."""
  path = str(tmp_path_factory.mktemp("qwen25vl"))
  tok = _train_tokenizer(path)
  ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
  text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=ids["<|im_end|>"],
              pad_token_id=ids["<|endoftext|>"], max_position_embeddings=2048,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
  torch.manual_seed(0)
  cfg = transformers.Qwen2_5_VLConfig(
      vision_config=VISION, text_config=text, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
      vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
      eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
  model = transformers.Qwen2_5_VLForConditionalGeneration(cfg).eval()
  with torch.no_grad():  # larger than the default init, so that images and positions move the logits
    for name, p in model.named_parameters():
      p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name or "ln_q" in name else 0.15 * torch.randn_like(p))
  model.save_pretrained(path)
  _image_processor().save_pretrained(path)
  return model, path


def _config(path, steps=2):
  config = il_config.get_config("smoke")
  config.model.hf_checkpoint = path
  config.data.image_size = IMAGE_SIZE
  config.data.max_images = 2
  config.train.steps = steps
  return config


def _image(seed, size=45):
  return Image.fromarray(np.random.RandomState(seed).randint(0, 256, (size, size, 3), np.uint8))


def _samples(tmp_path, n):
  items = []
  for i in range(n):
    img = os.path.join(tmp_path, f"shot{i}.png")
    _image(i).save(img)
    items.append({"id": f"s{i}", "images": [img], "conversations": [
        {"from": "human", "value": f"<image>\nTask {i}: what do you click?"},
        {"from": "gpt", "value": f"click(element={i})"}]})
  return items


def _hf_inputs(tok, images, messages, add_generation_prompt=False):
  """The HF way: the chat template, then each `<|image_pad|>` repeated grid.prod() / merge² times and the text
  tokenised, as `Qwen2_5_VLProcessor.__call__` (`replace_image_token`) does; the processor itself cannot be built
  here, as its video half needs torchvision."""
  vision = _image_processor()(images=images, return_tensors="pt")
  text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
  parts = text.split("<|image_pad|>")
  assert len(parts) == len(images) + 1
  counts = [int(g.prod()) // 4 for g in vision["image_grid_thw"]]
  text = parts[0] + "".join("<|image_pad|>" * n + rest for n, rest in zip(counts, parts[1:]))
  ids = tok([text], return_tensors="pt")["input_ids"]
  image_id = tok.convert_tokens_to_ids("<|image_pad|>")
  return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mm_token_type_ids": (ids == image_id).long(),
          **vision}


def test_preprocessing_matches_hf_processor(checkpoint):
  built = models.build(_config(checkpoint[1]), load_tokenizer(checkpoint[1]))
  images = built.preprocess
  assert isinstance(images, qwen_vl.QwenImages) and images.size == 32 and images.grid == (1, 8, 8)
  assert built.num_image_tokens == images.tokens_per_image == 16 and built.image_size == 32
  pics = [_image(0), _image(1, size=29)]
  want = _image_processor()(images=pics, return_tensors="np")
  got = images(pics)
  np.testing.assert_array_equal(want["image_grid_thw"], [[1, 8, 8]] * 2)
  assert got.shape == (2, 64, 3 * 2 * 4 * 4)
  np.testing.assert_allclose(got.reshape(-1, got.shape[-1]), want["pixel_values"], atol=1e-5, rtol=0)


def test_training_sample_matches_hf_tokens_and_rope_index(checkpoint, tmp_path):
  hf_model, path = checkpoint
  tok = load_tokenizer(path)
  assert conversation.template_image_token(tok) == "<|image_pad|>"
  built = models.build(_config(path), tok)
  item = _samples(tmp_path, 1)[0]
  encode = pipeline.EncodeSample(tok, 128, built.num_image_tokens, built.preprocess, built.image_size, 2)
  out = encode(item)
  messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Task 0: what do you click?"}]},
              {"role": "assistant", "content": [{"type": "text", "text": "click(element=0)"}]}]
  hf = _hf_inputs(tok, [Image.open(item["images"][0])], messages)
  want_ids = hf["input_ids"][0].numpy()
  n = int(out["attention_mask"].sum())
  got_ids = np.append(out["input_ids"][:n], out["targets"][n - 1])
  np.testing.assert_array_equal(got_ids, want_ids)
  assert (got_ids == built.preprocess.config.image_token_id).sum() == 16
  want_pos, _ = hf_model.model.get_rope_index(hf["input_ids"], hf["mm_token_type_ids"],
                                              image_grid_thw=hf["image_grid_thw"])
  assert out["positions"].shape == (3, 128)
  np.testing.assert_array_equal(out["positions"][:, :n], want_pos[:, 0, :n].numpy())
  assert (out["positions"][0, :n] != out["positions"][1, :n]).any()  # the image rows differ from the temporal axis
  np.testing.assert_allclose(out["patches"][0], hf["pixel_values"].numpy(), atol=1e-5, rtol=0)
  assert out["image_mask"].tolist() == [True, False] and not out["patches"][1].any()
  # The loss covers the reply and its closing <|im_end|>, nothing of the prompt or the image.
  target_text = tok.decode(out["targets"][:n][out["loss_mask"][:n] == 1].tolist())
  assert target_text.startswith("click(element=0)<|im_end|>"), target_text


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [row["loss"] for row in map(json.loads, f) if "loss" in row]


@pytest.fixture(scope="module")
def trained(checkpoint, tmp_path_factory):
  from jaxagent.pipeline.finetune import finetune
  tmp = tmp_path_factory.mktemp("qwen_run")
  config = _config(checkpoint[1], steps=8)
  config.train.batch_size = 2
  config.train.log_every = 1
  config.optim.lr = 3e-3
  workdir = str(tmp / "run")
  finetune(config, workdir, _samples(str(tmp), 4))
  return workdir


@pytest.mark.slow
def test_finetune_from_the_directory_lowers_the_loss(trained):
  losses = _losses(trained)
  print("qwen2.5-vl finetune losses:", [round(x, 3) for x in losses])
  assert len(losses) == 8 and all(np.isfinite(losses))
  assert np.mean(losses[-2:]) < 0.7 * np.mean(losses[:2]), losses


@pytest.mark.slow
def test_trained_policy_acts_as_transformers_generates(checkpoint, trained, tmp_path):
  from jaxagent.pipeline.policy import ModelPolicy
  from jaxagent.serving import checkpoint as ckpt
  from jaxagent.serving.qwen_engine import QwenVLEngine

  loaded = ckpt.load_policy(trained)
  assert qwen_vl.is_qwen(loaded) and loaded.num_image_tokens == 16
  policy = ModelPolicy(loaded, "autoui", temperature=0.0, max_tokens=12)
  assert isinstance(policy.engine, QwenVLEngine)
  image = _image(7)
  tasks = ["Task 1: what do you click?", "Task 3: the search box is empty, so what do you click next?"]
  rows = [[{"from": "human", "value": f"<image>\n{t}"}] for t in tasks]
  got = policy.generate_turns(rows, [[image], [image]])  # one sampler call; the shorter prompt is right-padded
  sampled = policy.generate_turns(rows, [[image], [image]], temperature=1.0)
  assert len(sampled) == 2 and all(isinstance(x, str) for x in sampled)

  exported = ckpt.export_policy(loaded, str(tmp_path / "export"))
  hf_model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(exported).eval()
  tok = load_tokenizer(exported)
  want = []
  for task in tasks:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": task}]}]
    hf = _hf_inputs(tok, [image], messages, add_generation_prompt=True)
    with torch.no_grad():
      out = hf_model.generate(**hf, max_new_tokens=12, do_sample=False)
    want.append(tok.decode(out[0, hf["input_ids"].shape[1]:].tolist(), skip_special_tokens=True).strip())
  print(f"policy: {got}; transformers: {want}")
  assert all(len(set(w)) > 2 for w in want), want  # varied replies: position mistakes would show
  assert got == want
  # The export reloads as a HF directory at the same fixed side.
  again = ckpt.load_policy(exported)
  assert again.preprocess.size == 32 and again.num_image_tokens == 16


def test_serving_and_kind_refusals(checkpoint):
  from jaxagent import serve
  config = _config(checkpoint[1])
  config.model.kind = "decoder"
  with pytest.raises(ValueError, match="config.model.kind"):
    models.build(config, load_tokenizer(checkpoint[1]))
  with pytest.raises(ValueError, match="continuous-batching server"):
    serve.build(checkpoint[1])
