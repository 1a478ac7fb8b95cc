"""idefics2 (OpenWebVoyager's policy family) against a tiny random `Idefics2ForConditionalGeneration`."""

import jax.numpy as jnp
import numpy as np
import PIL.Image
import pytest
import torch
import transformers
from flax import nnx

from jaxagent.models import sampler, vit, vlm
from jaxagent.models.hf import idefics2 as hf_idefics2

REL_TOL = 1e-4
IMAGE_TOKEN, WRAP = 120, 121


def _config(image_size=28):
  return transformers.Idefics2Config(
      image_token_id=IMAGE_TOKEN,
      vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         image_size=image_size, patch_size=7),
      perceiver_config=dict(hidden_size=64, resampler_n_latents=4, resampler_depth=2, resampler_n_heads=4,
                            resampler_head_dim=8, num_key_value_heads=2, rms_norm_eps=1e-5),
      text_config=dict(model_type="mistral", vocab_size=128, hidden_size=64, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       rms_norm_eps=1e-5, sliding_window=None, pad_token_id=0, bos_token_id=1, eos_token_id=2))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  torch.manual_seed(0)
  model = transformers.Idefics2ForConditionalGeneration(_config())
  with torch.no_grad():
    for p in model.parameters():
      p.normal_(0.0, 0.15)
  path = tmp_path_factory.mktemp("idefics2")
  model.eval().save_pretrained(path)
  return model, path


def _prompt(n_images, per_image=4, seed=0):
  """Text with each image as <fake> + image tokens + <fake>, as Idefics2Processor writes it."""
  rng = np.random.RandomState(seed)
  ids = list(rng.randint(3, 100, 5))
  for _ in range(n_images):
    ids += [WRAP] + [IMAGE_TOKEN] * per_image + [WRAP] + list(rng.randint(3, 100, 3))
  return np.asarray([ids], np.int64)


def _hf_logits(model, ids, pixels):
  with torch.no_grad():
    pv = torch.from_numpy(pixels.transpose(0, 3, 1, 2))[None]
    return model(input_ids=torch.from_numpy(ids), pixel_values=pv).logits.numpy()


def _rel(ours, theirs):
  return float(np.max(np.abs(np.asarray(ours) - theirs)) / np.max(np.abs(theirs)))


@pytest.mark.slow
def test_logits_match_transformers_with_one_and_two_images(ckpt):
  hf_model, path = ckpt
  model, cfg = hf_idefics2.load_pretrained(path)
  assert cfg.num_image_tokens == 4 and cfg.vision.position_grid == 4
  for n in (1, 2):
    ids = _prompt(n, seed=n)
    pixels = np.random.RandomState(n).randn(n, 28, 28, 3).astype(np.float32)
    ours = nnx.jit(lambda m, i, x: m(i, x))(model, jnp.asarray(ids, jnp.int32), jnp.asarray(pixels))
    assert _rel(ours, _hf_logits(hf_model, ids, pixels)) < REL_TOL


@pytest.mark.slow
def test_connector_features_match_transformers(ckpt):
  hf_model, path = ckpt
  model, _ = hf_idefics2.load_pretrained(path)
  pixels = np.random.RandomState(3).randn(2, 28, 28, 3).astype(np.float32)
  with torch.no_grad():
    want = hf_model.model.get_image_features(torch.from_numpy(pixels.transpose(0, 3, 1, 2))[None]).pooler_output
  ours = np.asarray(model.image_features(jnp.asarray(pixels))).reshape(-1, 64)
  assert _rel(ours, torch.cat(list(want)).numpy()) < REL_TOL


@pytest.mark.slow
def test_smaller_images_bucket_their_positions_as_transformers(ckpt):
  """21-pixel images (3x3 patches) on the 4x4 position table: HF's fractional buckets, rows 0, 1, 2."""
  hf_model, path = ckpt
  model, cfg = hf_idefics2.load_pretrained(path, image_size=21)
  assert cfg.vision.position_ids().tolist() == [0, 1, 2, 4, 5, 6, 8, 9, 10]
  ids, pixels = _prompt(1), np.random.RandomState(5).randn(1, 21, 21, 3).astype(np.float32)
  ours = model(jnp.asarray(ids, jnp.int32), jnp.asarray(pixels))
  assert _rel(ours, _hf_logits(hf_model, ids, pixels)) < REL_TOL


def test_greedy_generation_matches_transformers(ckpt):
  hf_model, path = ckpt
  model, _ = hf_idefics2.load_pretrained(path)
  ids, pixels = _prompt(1, seed=7), np.random.RandomState(7).randn(1, 28, 28, 3).astype(np.float32)
  with torch.no_grad():
    want = hf_model.generate(input_ids=torch.from_numpy(ids),
                             pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2))[None],
                             max_new_tokens=6, do_sample=False, eos_token_id=None)[0, ids.shape[1]:].numpy()
  out = vlm.sample(model, ids.astype(np.int32), np.ones_like(ids, bool), pixels,
                   sampler.SamplingConfig(max_new_tokens=6, temperature=0.0, eos_ids=()))
  assert np.asarray(out.tokens)[0].tolist() == want.tolist()


def test_export_loads_in_transformers_with_the_same_logits(ckpt, tmp_path):
  hf_model, path = ckpt
  model, cfg = hf_idefics2.load_pretrained(path)
  hf_idefics2.save_pretrained(model, cfg, tmp_path)
  again = transformers.Idefics2ForConditionalGeneration.from_pretrained(tmp_path).eval()
  ids, pixels = _prompt(1, seed=9), np.random.RandomState(9).randn(1, 28, 28, 3).astype(np.float32)
  np.testing.assert_allclose(_hf_logits(again, ids, pixels), _hf_logits(hf_model, ids, pixels), rtol=0, atol=1e-5)


def test_bucketed_positions_need_a_siglip_grid_at_least_the_image():
  with pytest.raises(ValueError, match="position_grid"):
    vit.ViTConfig.siglip(image_size=28, patch_size=7, position_grid=3)


# idefics2-8b's chat template (its processor's `chat_template`): the processor wraps each <image>.
IDEFICS2_TEMPLATE = (
    "{% for message in messages %}{{message['role'].capitalize()}}{% if message['content'][0]['type'] == 'image' %}"
    "{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}"
    "{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")


@pytest.fixture(scope="module")
def owv_dir(tmp_path_factory):
  """An idefics2 checkpoint as OpenWebVoyager starts from: weights, a tokenizer with <image>,
  <fake_token_around_image> and <end_of_utterance>, and idefics2's chat template."""
  from jaxagent.data.tokenizer import IMAGE_TOKEN, load_tokenizer  # pylint: disable=g-import-not-at-top
  tok = load_tokenizer()
  tok.add_special_tokens({"additional_special_tokens": [hf_idefics2.WRAP_TOKEN]})
  tok.chat_template = IDEFICS2_TEMPLATE
  config = _config()
  config.image_token_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
  config.text_config.vocab_size = -(-len(tok) // 64) * 64
  config.text_config.bos_token_id, config.text_config.eos_token_id = tok.bos_token_id, tok.eos_token_id
  torch.manual_seed(1)
  model = transformers.Idefics2ForConditionalGeneration(config)
  with torch.no_grad():
    for p in model.parameters():
      p.normal_(0.0, 0.15)
  path = tmp_path_factory.mktemp("owv_idefics2")
  model.eval().save_pretrained(path)
  tok.save_pretrained(path)
  return path


def test_a_recipe_builds_idefics2_and_wraps_each_image_as_its_processor(owv_dir):
  from configs import il as il_config  # pylint: disable=g-import-not-at-top
  from jaxagent import models  # pylint: disable=g-import-not-at-top
  from jaxagent.data import conversation, pipeline  # pylint: disable=g-import-not-at-top
  from jaxagent.data.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  config = il_config.get_config("")
  config.model.hf_checkpoint = str(owv_dir)
  tok = load_tokenizer(str(owv_dir))
  built = models.build(config, tok)
  wrap, image = tok.convert_tokens_to_ids(hf_idefics2.WRAP_TOKEN), tok.convert_tokens_to_ids("<image>")
  assert built.num_image_tokens == 4 and built.image_wrap_id == wrap and built.image_size == 28
  item = {"id": "a", "images": ["x.png", "y.png"], "conversations": [
      {"from": "human", "value": "<image><image>Buy the kettle."}, {"from": "gpt", "value": "click [3]"}]}
  ids, loss = conversation.tokenize(item, tok, built.num_image_tokens, built.image_wrap_id)
  first = int(np.flatnonzero(ids == wrap)[0])
  # Two adjacent images: <fake> 4 x <image> <fake> 4 x <image> <fake>, as Idefics2Processor collapses them.
  assert ids[first:first + 11].tolist() == [wrap] + [image] * 4 + [wrap] + [image] * 4 + [wrap]
  assert loss[ids == wrap].sum() == 0 and loss.sum() > 0
  out, n_images = conversation.encode(item, tok, first + 7, built.num_image_tokens, built.image_wrap_id)
  # The cut second block is dropped; the <fake> it shared with the first stays, closing the first.
  assert n_images == 1 and out["attention_mask"].sum() == first + 5
  assert out["input_ids"][:first + 5].tolist() == ids[:first + 5].tolist() and out["targets"][first + 4] == wrap
  single = dict(item, images=["x.png"], conversations=[{"from": "human", "value": "Buy <image> now."},
                                                       item["conversations"][1]])
  ids1, _ = conversation.tokenize(single, tok, 4, wrap)
  start = int(np.flatnonzero(ids1 == wrap)[0])
  out, n_images = conversation.encode(single, tok, start + 2, 4, wrap)
  assert n_images == 0 and out["attention_mask"].sum() == start - 1  # its own opening <fake> goes with it
  model = built.pretrained()
  assert isinstance(model, vlm.VLM) and model.config.perceiver is not None
  encode = pipeline.EncodeSample(tok, 128, built.num_image_tokens, None, 0, 2, built.image_wrap_id)
  assert (encode(item)["input_ids"] == wrap).sum() == 3


@pytest.mark.slow
def test_export_runs_in_transformers_processor_and_generate_as_our_engine(owv_dir, tmp_path):
  from jaxagent.serving import checkpoint  # pylint: disable=g-import-not-at-top
  from jaxagent.serving.engine import Engine, GenerationRequest  # pylint: disable=g-import-not-at-top
  policy = checkpoint.load_policy(str(owv_dir))
  assert policy.image_wrap_id is not None and policy.num_image_tokens == 4
  out = str(tmp_path / "export")
  checkpoint.export_policy(policy, out)
  hf_idefics2.write_processor_config(policy.model.config, out)
  image = (np.random.RandomState(0).rand(50, 50, 3) * 255).astype(np.uint8)
  # The image last: transformers 5 inserts a space between a closing <fake> and a word (the processor OWV
  # trained with did not, nor do we), so the prompts agree when no word follows the image.
  # Our parts are joined by newlines, as training samples write them; HF's messages say the same text.
  engine = Engine(policy, max_new_tokens=6)
  request = [{"role": "user", "content": [{"type": "text", "text": "Open the shop."}, {"type": "image", "image": image}]}]
  messages = [{"role": "user", "content": [{"type": "text", "text": "Open the shop.\n"}, {"type": "image"}]}]
  ours = engine.generate([GenerationRequest(request, max_tokens=6, temperature=0.0)])[0]
  processor = transformers.AutoProcessor.from_pretrained(out)
  model = transformers.AutoModelForImageTextToText.from_pretrained(out).eval()
  prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
  assert prompt == engine.render(request)
  inputs = processor(text=prompt, images=[[PIL.Image.fromarray(image)]], return_tensors="pt")
  np.testing.assert_allclose(inputs["pixel_values"][0, 0].numpy(), policy.preprocess([image])[0].transpose(2, 0, 1),
                             atol=1e-4)
  with torch.no_grad():
    generated = model.generate(**inputs, max_new_tokens=6, do_sample=False)[0, inputs["input_ids"].shape[1]:]
  assert ours.completion_tokens == 6
  assert processor.tokenizer.decode(generated, skip_special_tokens=True) == ours.text


def test_the_owv_paper_variant_refuses_a_checkpoint_of_another_family(owv_dir, tmp_path):
  from configs import openwebvoyager  # pylint: disable=g-import-not-at-top
  from jaxagent import models  # pylint: disable=g-import-not-at-top
  from jaxagent.data.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  config = openwebvoyager.get_config("paper")
  config.model.hf_checkpoint = str(owv_dir)
  assert models.build(config, load_tokenizer(str(owv_dir))).image_wrap_id is not None
  (tmp_path / "config.json").write_text('{"model_type": "llava"}')
  config.model.hf_checkpoint = str(tmp_path)
  with pytest.raises(ValueError, match="hf_family='idefics2'"):
    models.build(config, load_tokenizer(str(owv_dir)))


@pytest.mark.slow
def test_a_stage_fine_tuned_from_idefics2_serves_the_greedy_reply_of_our_engine(owv_dir, tmp_path):
  """The claim of docs/models.md: an idefics2 checkpoint trains (`finetune` from `model.hf_checkpoint`, its
  loss finite), and the trained stage serves (`jaxagent.serve`'s chat endpoint with an inline image) the reply the
  engine gives the same messages."""
  import base64  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import httpx  # pylint: disable=g-import-not-at-top
  from configs import il as il_config  # pylint: disable=g-import-not-at-top
  from jaxagent import serve  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.finetune import finetune  # pylint: disable=g-import-not-at-top
  from jaxagent.serving.engine import GenerationRequest  # pylint: disable=g-import-not-at-top
  config = il_config.get_config("smoke")
  config.model.hf_checkpoint = str(owv_dir)
  config.data.update(image_size=28, max_images=1, seq_len=128)
  config.train.update(steps=2, batch_size=2)
  images = [(np.random.RandomState(i).rand(40, 40, 3) * 255).astype(np.uint8) for i in range(2)]
  items = []
  for i, image in enumerate(images):
    PIL.Image.fromarray(image).save(tmp_path / f"shot{i}.png")
    items.append({"id": f"s{i}", "images": [str(tmp_path / f"shot{i}.png")], "conversations": [
        {"from": "human", "value": f"Task {i}: what do you click?\n<image>"}, {"from": "gpt", "value": f"click {i}"}]})
  stage = str(tmp_path / "il")
  finetune(config, stage, items)
  with open(os.path.join(stage, "metrics.jsonl"), encoding="utf-8") as f:
    assert all(np.isfinite(row["loss"]) for row in map(json.loads, f) if "loss" in row)
  buf = io.BytesIO()
  PIL.Image.fromarray(images[0]).save(buf, format="PNG")
  url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
  text = "Task 0: what do you click?\n"
  app, batcher = serve.build(stage, max_new_tokens=4)
  try:
    assert batcher.engine.policy.image_wrap_id is not None  # idefics2's <fake_token_around_image> wraps the image
    with serve.RunningServer(app) as server:
      reply = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
          "temperature": 0.0, "max_tokens": 4, "messages": [{"role": "user", "content": [
              {"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}]}).json()
    ours = batcher.generate(GenerationRequest([{"role": "user", "content": [
        {"type": "text", "text": text}, {"type": "image", "image": images[0]}]}], max_tokens=4, temperature=0.0))
  finally:
    batcher.close()
  assert "choices" in reply, reply
  assert reply["choices"][0]["message"]["content"] == ours.text and reply["usage"]["completion_tokens"] == 4
