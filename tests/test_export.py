"""`python -m jaxagent.export`: a recipe stage's policy as a directory that `transformers` loads with
`AutoProcessor` / `AutoTokenizer` and runs with `generate()` unchanged, giving our engine's greedy tokens."""

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from configs import il as il_config
from jaxagent import export, models, sharding
from jaxagent.data.tokenizer import IMAGE_TOKEN, load_tokenizer
from jaxagent.serving import checkpoint
from jaxagent.serving.engine import Engine, GenerationRequest
from jaxagent.train.checkpoint import Checkpointer
from jaxagent.train.optim import make_optimizer
from jaxagent.train.state import create_train_state

MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Open the shop."}]}]


def _stage(path, variant, hf_checkpoint=""):
  """A recipe stage directory as `pipeline.finetune` leaves it (config, tokenizer, an Orbax step)."""
  config = il_config.get_config(variant)
  config.model.decoder.update(hidden_size=64, num_layers=1, head_dim=16, intermediate_size=128)
  if hf_checkpoint:  # a Qwen2.5-VL (or other HF) directory the stage was trained from
    config.model.hf_checkpoint = hf_checkpoint
  config.data.seq_len = 128
  tokenizer = load_tokenizer()
  tokenizer.save_pretrained(os.path.join(path, "tokenizer"))
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  tx, _ = make_optimizer(config.optim, config.train.steps)
  ts = create_train_state(models.build(config, tokenizer).init, tx, sharding.make_mesh(dict(config.mesh)))
  ckpt = Checkpointer(os.path.join(path, "checkpoints"), async_save=False)
  ckpt.save(1, ts.state, jax.random.key(0), {}, force=True)
  ckpt.close()


@pytest.fixture(scope="module")
def recipe_workdir(tmp_path_factory):
  root = tmp_path_factory.mktemp("recipe")
  _stage(str(root / "il"), "")
  _stage(str(root / "online" / "0" / "actor"), "text")
  return str(root)


@pytest.mark.slow  # trains a stage to export
def test_lists_the_stages_and_refuses_a_missing_one(recipe_workdir, tmp_path):
  assert export.stages(recipe_workdir) == ["il", os.path.join("online", "0", "actor")]
  with pytest.raises(FileNotFoundError, match="stages under .*: il, online/0/actor"):
    export.export(recipe_workdir, str(tmp_path / "out"), stage="critic")


@pytest.mark.slow  # trains a stage to export
def test_vlm_export_runs_in_transformers_as_our_engine_does(recipe_workdir, tmp_path):
  out = export.export(recipe_workdir, str(tmp_path / "vlm"), stage="il")
  image = (np.random.RandomState(0).rand(60, 40, 3) * 255).astype(np.uint8)  # not square: padding matters
  policy = checkpoint.load_policy(os.path.join(recipe_workdir, "il"))
  ours = Engine(policy, max_new_tokens=8).generate(
      [GenerationRequest([{"role": "user", "content": [{"type": "image", "image": image}, MESSAGES[0]["content"][1]]}],
                         max_tokens=8, temperature=0.0)])[0]

  processor = transformers.AutoProcessor.from_pretrained(out)
  model = transformers.AutoModelForImageTextToText.from_pretrained(out).eval()
  prompt = processor.apply_chat_template(MESSAGES, add_generation_prompt=True)
  inputs = processor(text=prompt, images=[image], return_tensors="pt")
  image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
  assert int((inputs["input_ids"] == image_id).sum()) == policy.num_image_tokens
  ours_pixels = policy.preprocess([image])[0].transpose(2, 0, 1)
  np.testing.assert_allclose(inputs["pixel_values"][0].numpy(), ours_pixels, atol=1e-4)
  with torch.no_grad():
    generated = model.generate(**inputs, max_new_tokens=8)[0, inputs["input_ids"].shape[1]:]
  assert ours.completion_tokens == 8 and ours.text
  assert processor.tokenizer.decode(generated, skip_special_tokens=True) == ours.text
  assert set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
             else [model.generation_config.eos_token_id]) == set(policy.eos_ids)


@pytest.mark.slow  # trains a stage to export
def test_decoder_export_runs_in_transformers_as_our_engine_does(recipe_workdir, tmp_path):
  out = export.export(recipe_workdir, str(tmp_path / "text"), stage=os.path.join("online", "0", "actor"))
  policy = checkpoint.load_policy(out)
  messages = [{"role": "user", "content": "Find the price of the kettle."}]
  ours = Engine(policy, max_new_tokens=8).generate([GenerationRequest(messages, max_tokens=8, temperature=0.0)])[0]
  tok = transformers.AutoTokenizer.from_pretrained(out)
  model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
  with torch.no_grad():
    generated = model.generate(**ids, max_new_tokens=8)[0, ids["input_ids"].shape[1]:]
  assert ours.completion_tokens == 8 and ours.text
  assert tok.decode(generated, skip_special_tokens=True) == ours.text


def _tiny_qwen(path):
  """A tiny random Qwen2.5-VL directory over the default tokenizer (its `<image>` as the image-pad token)."""
  tok = load_tokenizer()
  torch.manual_seed(0)
  cfg = transformers.Qwen2_5_VLConfig(
      vision_config=dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=64, patch_size=4,
                         temporal_patch_size=2, spatial_merge_size=2, window_size=16, fullatt_block_indexes=[0]),
      text_config=dict(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}),
      image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN), video_token_id=1000, vision_start_token_id=1001,
      vision_end_token_id=1002, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
  transformers.Qwen2_5_VLForConditionalGeneration(cfg).save_pretrained(path)
  return path


@pytest.mark.slow  # trains a stage to export
def test_a_qwen2_5_vl_stage_exports_and_loads_back_with_its_image_processor(tmp_path):
  hf_dir = _tiny_qwen(str(tmp_path / "hf"))
  _stage(str(tmp_path / "recipe" / "il"), "", hf_checkpoint=hf_dir)
  out = export.export(str(tmp_path / "recipe"), str(tmp_path / "qwen"), stage="il")
  policy = checkpoint.load_policy(str(tmp_path / "recipe" / "il"))
  again = checkpoint.load_policy(out)
  assert again.preprocess.size == policy.preprocess.size and again.num_image_tokens == policy.num_image_tokens
  for ours, back in zip(jax.tree.leaves(nnx.state(policy.model, nnx.Param)),
                        jax.tree.leaves(nnx.state(again.model, nnx.Param)), strict=True):
    np.testing.assert_array_equal(np.asarray(back), np.asarray(ours))
  image = (np.random.RandomState(0).rand(32, 32, 3) * 255).astype(np.uint8)
  hf_pixels = transformers.AutoImageProcessor.from_pretrained(out)(images=[image], return_tensors="np")
  np.testing.assert_array_equal(hf_pixels["image_grid_thw"], [policy.preprocess.grid])
  np.testing.assert_allclose(hf_pixels["pixel_values"], policy.preprocess([image])[0], atol=1e-5)


def test_only_policy_stages_are_listed_and_a_critic_is_refused_with_its_reason(tmp_path):
  """A critic's directory (checkpoints only) and an AutoUI actor's are training stages `export` cannot write:
  neither is listed, and asking for one names why."""
  for stage, kind in (("il", "vlm"), ("critic", None), ("critics/step_critic", None), ("autoui_actor", "autoui")):
    os.makedirs(tmp_path / stage / "checkpoints" / "1")
    if kind:
      (tmp_path / stage / "config.json").write_text(json.dumps({"model": {"kind": kind}}))
  assert export.stages(str(tmp_path)) == ["il"]
  with pytest.raises(ValueError, match="critic or value head.*that can: il"):
    export.export(str(tmp_path), str(tmp_path / "out"), stage="critic")
  with pytest.raises(ValueError, match="AutoUI"):
    export.export(str(tmp_path), str(tmp_path / "out"), stage="autoui_actor")
