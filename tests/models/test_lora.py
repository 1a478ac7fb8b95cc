"""LoRA (`models.lora`, `config.model.lora`): a fresh adapter changes nothing, merging keeps the logits, a train
step with the adapters' filter moves them alone, and a LoRA fine-tune reloads and exports to plain weights."""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from configs import il as il_config
from jaxagent import config_lib, models, sharding
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.models import layers, llama, lora, vlm
from jaxagent.pipeline.config import ConfigError, validate
from jaxagent.serving import checkpoint
from jaxagent.train.state import create_train_state
from jaxagent.train.step import build_train_step, put_batch

IDS = jnp.asarray(np.random.RandomState(0).randint(0, 256, (2, 12)), jnp.int32)


def _perturb(model, seed=1, scale=0.05):
  """Adapters no fresh init has (B random, not zero)."""
  leaves = jax.tree.leaves(nnx.state(model, lora.LoRAParam), is_leaf=lambda x: isinstance(x, nnx.Variable))
  for i, var in enumerate(leaves):
    value = var.get_value()
    var.set_value(value + scale * jax.random.normal(jax.random.key(seed + i), value.shape, value.dtype))
  return model


def _tiny_vlm():
  cfg = vlm.VLMConfig.tiny(256, vision={"image_size": 32}, text={"hidden_size": 64, "head_dim": 16,
                                                                  "intermediate_size": 128})
  images = jax.random.normal(jax.random.key(3), (1, 32, 32, 3))
  ids = jnp.concatenate([jnp.full((1, cfg.num_image_tokens), cfg.image_token_id), IDS[:1]], axis=1)
  return vlm.init_vlm(cfg, 0), ids, images


def test_rank_zero_adds_nothing_and_the_default_config_builds_the_plain_model():
  model = llama.init_decoder(llama.DecoderConfig.tiny(), 0)
  before = nnx.graphdef(model)
  assert lora.add_lora(model, 0) is model and nnx.graphdef(model) == before and not lora.has_lora(model)
  config = il_config.get_config("text")
  assert config.model.lora.rank == 0 and config.model.lora.targets == models.DEFAULT_LORA_TARGETS
  built = models.build(config, load_tokenizer())
  assert built.trainable is nnx.Param and built.lora is None


@pytest.mark.slow
def test_a_fresh_adapter_leaves_the_logits_and_merging_folds_it_in():
  model = llama.init_decoder(llama.DecoderConfig.tiny(), 0)
  base = model(IDS)
  lora.add_lora(model, 4, 8.0)
  attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
  assert all(isinstance(d, lora.LoRADense) for d in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                                       mlp.gate_proj, mlp.up_proj, mlp.down_proj))
  assert attn.q_proj.lora_a.shape == (64, 4) and attn.q_proj.lora_b.shape == (4, 4, 16)  # heads kept as an axis
  assert attn.o_proj.lora_a.get_metadata()["logical_axes"] == ("heads", "head_dim", None)
  np.testing.assert_array_equal(model(IDS), base)

  adapted = _perturb(model)(IDS)
  assert float(jnp.abs(adapted - base).max()) > 1e-2
  merged = lora.merge(model)
  assert not lora.has_lora(merged) and not nnx.state(merged, lora.LoRAParam)
  assert type(merged.layers[0].self_attn.q_proj) is layers.Dense and lora.has_lora(model)  # the input is kept
  assert nnx.graphdef(merged) == nnx.graphdef(llama.init_decoder(llama.DecoderConfig.tiny(), 0))
  np.testing.assert_allclose(merged(IDS), adapted, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_vlm_projector_and_tower_targets():
  model, ids, images = _tiny_vlm()
  base = model(ids, images)
  lora.add_lora(model, 2, 4.0, "q_proj,v_proj,linear_1,linear_2,q,fc2")
  assert isinstance(model.projector.linear_1, lora.LoRADense)
  assert isinstance(model.vision_tower.blocks[0].attn.q, lora.LoRADense)
  assert not isinstance(model.decoder.layers[0].self_attn.k_proj, lora.LoRADense)
  np.testing.assert_array_equal(model(ids, images), base)
  adapted = _perturb(model)(ids, images)
  np.testing.assert_allclose(lora.merge(model)(ids, images), adapted, atol=1e-5, rtol=0)
  with pytest.raises(ValueError, match=r"\['linear_1'\] match no linear of this Decoder"):
    lora.add_lora(llama.init_decoder(llama.DecoderConfig.tiny(), 0), 2, 4.0, "q_proj,linear_1")


def _lora_config(rank=4):
  config = il_config.get_config("smoke")
  config.model.kind = "decoder"
  config.model.lora.rank = rank
  return config


@pytest.mark.slow
def test_a_train_step_with_the_lora_filter_moves_only_the_adapters():
  config = _lora_config()
  built = models.build(config, load_tokenizer())
  assert built.trainable is lora.LoRAParam and built.lora[:2] == (4, 16.0)

  def loss_fn(model, batch, rng):
    del rng
    logits = model(batch["input_ids"])
    return -jnp.mean(jax.nn.log_softmax(logits)[..., 0]), {}

  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  ts = create_train_state(built.init, optax.adam(1e-2), mesh, wrt=built.trainable)
  before = jax.device_get(ts.state)
  batch = {"input_ids": np.asarray(IDS) % 200}
  step, shardings = build_train_step(ts, loss_fn, optax.constant_schedule(1e-2), mesh, batch, wrt=built.trainable)
  ts.state, _ = step(ts.state, put_batch(batch, shardings), jax.random.key(0))
  after = jax.device_get(ts.state)
  base_of = lambda s: nnx.split_state(s[0], lora.LoRAParam, nnx.Param)[1]
  jax.tree.map(np.testing.assert_array_equal, base_of(before), base_of(after))
  moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), nnx.state(before[0], lora.LoRAParam),
                       nnx.state(after[0], lora.LoRAParam))
  assert any(jax.tree.leaves(moved))  # B moved off zero (A too, once B is nonzero)


@pytest.mark.parametrize("key,value,match", [
    ("rank", -1, "config.model.lora.rank=-1: must be a whole number >= 0"),
    ("rank", 2.5, "config.model.lora.rank=2.5"),
    ("alpha", 0.0, "config.model.lora.alpha=0.0: must be a number > 0"),
    ("targets", "q_proj,qkv", r"config.model.lora.targets='q_proj,qkv': \['qkv'\] are not linears LoRA adapts"),
    ("targets", "", "config.model.lora.targets='': names no linear; name one or more of"),
])
def test_bad_lora_values_are_refused_naming_the_key(key, value, match):
  config = il_config.get_config("smoke")
  block = {**config.model.lora.to_dict(), "rank": 4, key: value}  # as a workdir's config.json may hold it
  config.model.lora = ml_collections.ConfigDict(block)
  with pytest.raises(ConfigError, match=match):
    validate(config)


def test_lora_on_autoui_or_vlm_targets_on_a_decoder_are_refused():
  config = il_config.get_config("smoke")
  config.model.kind, config.model.lora.rank = "autoui", 8
  with pytest.raises(ConfigError, match="not AutoUI's T5.*--config.model.lora.rank=0"):
    validate(config)
  config = _lora_config()
  config.model.lora.targets = "q_proj,linear_1"
  with pytest.raises(ConfigError, match=r"\['linear_1'\] are VLM linears but model.kind=decoder"):
    validate(config)
  validate(_lora_config())  # the default targets pass
  assert tuple(lora.TARGETS) == models.LORA_TARGETS and lora.DEFAULT_TARGETS == models.DEFAULT_LORA_TARGETS
  assert config_lib.vlm_model().lora.targets == models.DEFAULT_LORA_TARGETS


@pytest.mark.slow
def test_a_hf_checkpoint_starts_from_its_weights_with_fresh_adapters(tmp_path):
  from jaxagent.models.hf import llama as hf_llama  # pylint: disable=g-import-not-at-top
  dcfg = llama.DecoderConfig.tiny()
  base = llama.init_decoder(dcfg, 5)
  hf_llama.save_pretrained(base, dcfg, str(tmp_path))
  config = _lora_config()
  config.model.hf_checkpoint = str(tmp_path)
  built = models.build(config, load_tokenizer())
  model = built.pretrained()
  assert lora.has_lora(model) and nnx.graphdef(model) == nnx.graphdef(nnx.eval_shape(built.init))
  np.testing.assert_allclose(model(IDS), base(IDS), atol=1e-6, rtol=0)
  # a model from elsewhere carrying other adapters: folded in, then this config's fresh ones
  adapted = _perturb(lora.add_lora(llama.init_decoder(dcfg, 5), 2, 4.0, "v_proj"))
  again = built.adapt(adapted)
  assert again.layers[0].self_attn.q_proj.rank == 4
  np.testing.assert_allclose(again(IDS), adapted(IDS), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_finetune_reloads_with_its_adapters_and_exports_merged_weights(tmp_path):
  """`pipeline.finetune` with LoRA → `load_policy` (adapters restored under the `wrt` filter) → `export_policy`
  (plain HF weights): our loader and `transformers` give the workdir's logits."""
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from jaxagent import export  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.finetune import finetune  # pylint: disable=g-import-not-at-top

  config = _lora_config()
  config.train.update(steps=3, batch_size=2)
  config.optim.update(lr=5e-2, warmup_steps=0)
  config.checkpoint.every = 3
  items = [{"id": f"s{i}", "conversations": [{"from": "human", "value": f"Task {i}: what do you click?"},
                                             {"from": "gpt", "value": f"click(element={i})"}]} for i in range(2)]
  workdir = str(tmp_path / "actor")
  finetune(config, workdir, items)

  loaded = checkpoint.load_policy(workdir)
  assert lora.has_lora(loaded.model)
  fresh = models.build(config, loaded.tokenizer).init()
  a_b = lambda m: nnx.state(m, lora.LoRAParam)
  assert not np.array_equal(*(np.asarray(a_b(m).layers[0].self_attn.q_proj.lora_b.get_value())
                              for m in (loaded.model, fresh)))  # trained, restored
  # the base stayed as initialised (eager here, jitted in training: equal up to float rounding)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
               nnx.split_state(nnx.state(fresh), lora.LoRAParam, ...)[1],
               nnx.split_state(nnx.state(loaded.model), lora.LoRAParam, ...)[1])
  ids = IDS % 200
  ours = np.asarray(loaded.model(ids))

  out = export.export(workdir, str(tmp_path / "hf"))
  tensors = safetensors.numpy.load_file(os.path.join(out, "model.safetensors"))
  assert tensors and not any("lora" in k for k in tensors)
  np.testing.assert_allclose(np.asarray(checkpoint.load_policy(out).model(ids)), ours, atol=1e-5, rtol=0)
  hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  with torch.no_grad():
    theirs = hf(torch.from_numpy(np.asarray(ids, np.int64))).logits.numpy()
  np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
