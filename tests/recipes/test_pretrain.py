"""End to end: the pre-training recipe's smoke config builds a base once into the cache; `model.base` points a
recipe's training at it (its weights, architecture and tokenizer) and a rerun reuses it."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from configs import pretrain as pretrain_config
from configs import webrl as webrl_config
from jaxagent.data import conversation
from jaxagent.pipeline.config import stage_config
from jaxagent.pipeline.finetune import finetune
from jaxagent.pipeline.stages import DONE, read_json
from jaxagent.recipes import pretrain
from jaxagent.serving.checkpoint import load_policy

pytestmark = pytest.mark.slow  # the module pre-trains the smoke base once


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  cache = str(tmp_path_factory.mktemp("cache"))
  old = os.environ.get("JAXAGENT_CACHE")
  os.environ["JAXAGENT_CACHE"] = cache
  try:
    config = webrl_config.get_config("smoke")
    config.model.base = "pretrain:smoke"
    pretrain.resolve(config)
    yield config, cache
  finally:
    if old is None:
      os.environ.pop("JAXAGENT_CACHE")
    else:
      os.environ["JAXAGENT_CACHE"] = old


def test_the_base_is_built_once_with_its_probes(base):
  config, cache = base
  path = config.model.hf_checkpoint
  assert path.startswith(cache) and os.path.exists(os.path.join(path, "config.json"))
  workdir = os.path.dirname(os.path.dirname(path))
  for stage in pretrain.STAGES:
    assert os.path.exists(os.path.join(workdir, stage, DONE)), stage
  results = read_json(os.path.join(workdir, "results.json"))
  assert 0.0 <= results["grounding"] <= 1.0 and 0.0 <= results["copy"] <= 1.0 and results["n"] > 0
  assert 0.0 <= results["run_on"] <= 1.0
  train = read_json(os.path.join(workdir, "train", DONE))
  assert train["fill"] > 0.5 and train["samples"] > 0
  assert config.data.tokenizer == ""  # the base's own
  with open(os.path.join(workdir, "warmup", "metrics.jsonl"), encoding="utf-8") as f:
    logged = [json.loads(line) for line in f]
  for part in ("reply", "link", "name", "previous", "span"):  # every head the committed targets name trains
    values = [m[f"{part}_attention"] for m in logged if f"{part}_attention" in m]
    assert values and all(np.isfinite(v) and v > 0 for v in values), part
  stamp = os.path.getmtime(os.path.join(workdir, "probes", DONE))
  again = webrl_config.get_config("smoke")
  again.model.base = "pretrain:smoke"
  pretrain.resolve(again)
  assert again.model.hf_checkpoint == path and os.path.getmtime(os.path.join(workdir, "probes", DONE)) == stamp


def test_a_recipe_stage_starts_from_the_base(base, tmp_path):
  config, _ = base
  sft = stage_config(config, config.sft, steps=1)
  sft.optim.lr = 0.0  # one step that changes nothing: the trained model is its start
  items = [conversation.text_sample("s0", 'Task Instruction: Open "Cart".', 'do(action="Click", element="3")')]
  finetune(sft, str(tmp_path / "sft"), items)
  trained, start = load_policy(str(tmp_path / "sft")), load_policy(config.model.hf_checkpoint)
  assert len(trained.tokenizer) == len(start.tokenizer)
  a, b = jax.tree.leaves(nnx.state(trained.model, nnx.Param)), jax.tree.leaves(nnx.state(start.model, nnx.Param))
  assert len(a) == len(b) and all(np.allclose(x, y) for x, y in zip(a, b))


def test_bad_bases_are_refused_naming_the_key(tmp_path):
  config = webrl_config.get_config("smoke")
  config.model.base = str(tmp_path / "missing")
  with pytest.raises(ValueError, match="config.model.base"):
    pretrain.resolve(config)
  config.model.base, config.model.hf_checkpoint = "pretrain", "smollm2"
  with pytest.raises(ValueError, match="hf_checkpoint"):
    pretrain.resolve(config)
  bad = pretrain_config.get_config("smoke")
  bad.probes.worlds.first = bad.corpus.worlds.first
  with pytest.raises(ValueError, match="overlap"):
    pretrain.check_config(bad)


def test_a_width_the_heads_do_not_divide_is_refused_before_any_work():
  bad = pretrain_config.get_config("smoke")
  bad.model.decoder.hidden_size = 64  # over 6 heads: Hugging Face's Llama refuses the exported base on load
  with pytest.raises(ValueError, match="hidden_size=64"):
    pretrain.check_config(bad)


@pytest.mark.parametrize("key,value,match", [("corpus.skills", "click,fly", "corpus.skills"),
                                             ("corpus.format", "webrl,braille", "corpus.format"),
                                             ("corpus.quotes", "straight,angled", "corpus.quotes"),
                                             ("targets.name_layer", -1, "name_layer"),
                                             ("targets.previous_heads", 5, "previous_heads"),
                                             ("targets.previous_readout_every", 0, "previous_readout_every"),
                                             ("targets.span_heads", 3, "span_heads"),
                                             ("targets.gate", -1.0, "targets.gate")])
def test_bad_corpus_and_target_values_are_refused_naming_the_key(key, value, match):
  bad = pretrain_config.get_config("smoke")
  section, field = key.split(".")
  bad[section][field] = value
  with pytest.raises(ValueError, match=match):
    pretrain.check_config(bad)


def test_skills_a_format_cannot_ask_are_refused_naming_the_key():
  bad = pretrain_config.get_config("phone")
  bad.corpus.skills = "read,say"  # the phone answers no text
  with pytest.raises(ValueError, match="corpus.skills.*autoui_text"):
    pretrain.check_config(bad)
