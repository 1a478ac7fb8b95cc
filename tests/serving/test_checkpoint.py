"""Policy checkpoints: a training workdir (config.json + tokenizer + Orbax step written by the training loop's
own Checkpointer) loads into the same weights on one device; a step directory and an export load too."""

import os

import jax
import numpy as np
import pytest
from flax import nnx

from configs import il as il_config
from jaxagent import models, sharding
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.serving import checkpoint
from jaxagent.serving.engine import Engine, GenerationRequest
from jaxagent.train.checkpoint import Checkpointer
from jaxagent.train.optim import make_optimizer
from jaxagent.train.state import create_train_state


def _params(model) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A text-policy run directory as `python -m jaxagent.main` leaves it, saved at step 3 on the 8-device mesh."""
  path = str(tmp_path_factory.mktemp("run"))
  config = il_config.get_config("text")
  config.model.decoder.update(hidden_size=64, num_layers=1, head_dim=16, intermediate_size=128)
  config.data.seq_len = 64
  tokenizer = load_tokenizer()
  tokenizer.save_pretrained(os.path.join(path, "tokenizer"))
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  model_fn = lambda: _perturbed(models.build(config, tokenizer).init())
  tx, _ = make_optimizer(config.optim, config.train.steps)
  ts = create_train_state(model_fn, tx, sharding.make_mesh(dict(config.mesh)))
  ckpt = Checkpointer(os.path.join(path, "checkpoints"), async_save=False)
  ckpt.save(3, ts.state, jax.random.key(0), {}, force=True)
  ckpt.close()
  return path, ts.model()


def _perturbed(model):
  """Weights no fresh init has (so a loader that silently re-initialises fails)."""
  for var in jax.tree.leaves(nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable)):
    var.set_value(var.get_value() + 0.01)
  return model


def test_workdir_loads_the_saved_weights(workdir):
  path, saved = workdir
  policy = checkpoint.load_policy(path)
  assert policy.kind == "decoder" and policy.name.endswith("@latest")
  for a, b in zip(_params(policy.model), _params(saved)):
    np.testing.assert_array_equal(a, b)
  by_step = checkpoint.load_policy(os.path.join(path, "checkpoints", "3"))
  assert by_step.name.endswith("@3")
  np.testing.assert_array_equal(_params(by_step.model)[0], _params(saved)[0])
  assert policy.tokenizer.convert_tokens_to_ids("<end_of_utterance>") in policy.eos_ids


def test_export_round_trip_generates_the_same(workdir, tmp_path):
  path, _ = workdir
  policy = checkpoint.load_policy(path)
  out = checkpoint.export_policy(policy, str(tmp_path / "export"))
  assert os.path.exists(os.path.join(out, checkpoint.POLICY_FILE))
  assert os.path.exists(os.path.join(out, "tokenizer.json"))
  again = checkpoint.load_policy(out)
  request = [GenerationRequest([{"role": "user", "content": "Find the price of the kettle."}], max_tokens=8,
                               temperature=0.0)]
  a = Engine(policy, max_new_tokens=8).generate(request)[0]
  b = Engine(again, max_new_tokens=8).generate(request)[0]
  assert a == b and a.completion_tokens >= 1


def test_bad_paths_say_what_is_missing(workdir, tmp_path):
  path, _ = workdir
  with pytest.raises(FileNotFoundError, match="not a directory"):
    checkpoint.load_policy(str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="neither a training workdir"):
    checkpoint.load_policy(str(tmp_path))
  bare = tmp_path / "bare"
  os.makedirs(bare / "checkpoints")
  with pytest.raises(FileNotFoundError, match="pass config="):
    checkpoint.load_policy(str(bare))


@pytest.mark.slow
def test_a_text_decoder_with_a_tokenizer_without_the_image_token_loads(tmp_path):
  """A decoder trained with its own tokenizer (SmolLM2's has no `<image>`, WebRL's `:smollm`) loads for acting:
  only a VLM's tokenizer needs the image placeholder."""
  from configs import webrl as webrl_config  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.config import stage_config  # pylint: disable=g-import-not-at-top
  recipe = webrl_config.get_config("smoke")
  config = stage_config(recipe, recipe.sft)  # what the SFT stage's workdir holds
  config.data.tokenizer = ""
  tokenizer = load_tokenizer("smollm2", require_image_token=False)
  tokenizer.save_pretrained(str(tmp_path / "tokenizer"))
  (tmp_path / "config.json").write_text(config.to_json_best_effort(indent=2))
  tx, _ = make_optimizer(config.optim, config.train.steps)
  ts = create_train_state(lambda: models.build(config, tokenizer).init(), tx, sharding.make_mesh(dict(config.mesh)))
  ckpt = Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
  ckpt.save(1, ts.state, jax.random.key(0), {}, force=True)
  ckpt.close()
  policy = checkpoint.load_policy(str(tmp_path))
  assert policy.kind == "decoder" and len(policy.tokenizer) == len(tokenizer)
  assert policy.tokenizer.convert_tokens_to_ids("<image>") in (None, policy.tokenizer.unk_token_id)
  np.testing.assert_array_equal(_params(policy.model)[0], _params(ts.model())[0])
