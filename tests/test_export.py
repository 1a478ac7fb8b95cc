"""`python -m jaxagent.export`: a recipe stage's policy as a directory that `transformers` loads with
`AutoProcessor` / `AutoTokenizer` and runs with `generate()` unchanged, giving our engine's greedy tokens."""

import os

import jax
import numpy as np
import pytest
import torch
import transformers

from configs import il as il_config
from jaxagent import export, models, sharding
from jaxagent.data.tokenizer import IMAGE_TOKEN, load_tokenizer
from jaxagent.serving import checkpoint
from jaxagent.serving.engine import Engine, GenerationRequest
from jaxagent.train.checkpoint import Checkpointer
from jaxagent.train.optim import make_optimizer
from jaxagent.train.state import create_train_state

MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Open the shop."}]}]


def _stage(path, variant):
  """A recipe stage directory as `pipeline.finetune` leaves it (config, tokenizer, an Orbax step)."""
  config = il_config.get_config(variant)
  config.model.decoder.update(hidden_size=64, num_layers=1, head_dim=16, intermediate_size=128)
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


def test_lists_the_stages_and_refuses_a_missing_one(recipe_workdir, tmp_path):
  assert export.stages(recipe_workdir) == ["il", os.path.join("online", "0", "actor")]
  with pytest.raises(FileNotFoundError, match="stages under .*: il, online/0/actor"):
    export.export(recipe_workdir, str(tmp_path / "out"), stage="critic")


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
