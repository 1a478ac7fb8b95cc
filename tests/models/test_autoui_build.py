"""`config.model.kind="autoui"`: DigiRL's encoder-decoder actor built, trained and acting through the recipes' path.

`models.build` → a frozen ViT under AutoUI; `data.seq2seq` encodes the device recipes' conversation samples;
`pipeline.finetune` trains it (the recipes' losses read the seq2seq batch); `serving.load_policy` rebuilds the
workdir and `pipeline.policy.ModelPolicy` acts with it (`serving.seq2seq_engine`).
"""

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from PIL import Image

from configs import digirl as digirl_config
from jaxagent import models, sharding
from jaxagent.data import seq2seq
from jaxagent.data.conversation import ConversationError
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.models import autoui
from jaxagent.pipeline import device
from jaxagent.pipeline.config import stage_config
from jaxagent.pipeline.finetune import finetune
from jaxagent.pipeline.policy import ModelPolicy
from jaxagent.rl.losses import AUTOUI_PROB_CLAMP
from jaxagent.serving.checkpoint import load_policy
from jaxagent.train.losses import sequence_nll, weighted_token_nll
from jaxagent.train.optim import make_optimizer
from jaxagent.train.state import create_train_state
from jaxagent.train.step import build_train_step, put_batch

REPLY = "Action Decision: PRESS_HOME"


def _config(**train):
  config = digirl_config.get_config("smoke")
  config.model.kind = "autoui"
  config.il.train.update(train)
  return stage_config(config, config.il)


def _screen(path, value):
  Image.fromarray(np.full((48, 40, 3), value, np.uint8)).save(path)
  return str(path)


def _sample(path, prompt="Goal: hi</s>", reply=REPLY, weight=1.0):
  return device.sample("s", path, prompt, reply, weight)


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer(None)


def test_the_seq2seq_encoding_of_a_device_sample(tmp_path, tokenizer):
  config = _config()
  built = models.build(config, tokenizer)
  encode = seq2seq.EncodeSeq2Seq(tokenizer, 8, 4, built.preprocess, built.image_size)
  arrays = encode(_sample(_screen(tmp_path / "a.png", 200), reply="hi", weight=0.5))
  # "Goal: hi" is [895, 369, 31, 385, 78] and "</s>" is EOS (2): the prompt's own </s>, then the appended EOS.
  np.testing.assert_array_equal(arrays["input_ids"], [895, 369, 31, 385, 78, 2, 2, 0])
  np.testing.assert_array_equal(arrays["attention_mask"], [1, 1, 1, 1, 1, 1, 1, 0])
  hi = tokenizer("hi", add_special_tokens=False)["input_ids"]
  assert hi == [77, 78]  # " hi" in the prompt is 385: the space is part of that token
  np.testing.assert_array_equal(arrays["targets"], [77, 78, 2, 0])  # the reply, then EOS
  np.testing.assert_array_equal(arrays["decoder_ids"], [0, 77, 78, 0])  # start (= pad) + the targets shifted
  np.testing.assert_array_equal(arrays["loss_mask"], [1, 1, 1, 0])
  assert arrays["images"].shape == (config.data.image_size, config.data.image_size, 3)
  assert arrays["weight"] == np.float32(0.5)
  assert "<image>" not in seq2seq.prompt_text(_sample("x.png")["conversations"][:1])
  with pytest.raises(ConversationError, match="one screenshot"):
    encode({"id": "two", "images": ["a", "b"], "conversations": [{"from": "human", "value": "<image><image>x"},
                                                                   {"from": "gpt", "value": "y"}]})
  with pytest.raises(ConversationError, match="seq_len"):
    seq2seq.EncodeSeq2Seq(tokenizer, 4, 4, built.preprocess, built.image_size)(_sample(str(tmp_path / "a.png")))


@pytest.mark.slow
def test_build_freezes_the_image_encoder_and_sizes_t5_from_the_decoder_block(tokenizer):
  config = _config()
  built = models.build(config, tokenizer)
  assert built.kind == "autoui" and built.flops_per_token > 0
  model = built.init()
  assert isinstance(model, autoui.ScreenAutoUI)
  t5 = model.config.text
  assert (t5.d_model, t5.num_layers, t5.num_decoder_layers, t5.d_kv, t5.d_ff) == (64, 1, 1, 16, 128)
  assert t5.decoder_start_token_id == t5.pad_token_id == tokenizer.pad_token_id
  trained = nnx.state(model, built.trainable)
  assert not any("image_encoder" in str(path) for path, _ in nnx.to_flat_state(trained))
  assert any("image_encoder" in str(path) for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("loss", [weighted_token_nll, sequence_nll(AUTOUI_PROB_CLAMP)],
                         ids=["token_nll", "digirl_sequence_nll"])
@pytest.mark.slow
def test_training_steps_lower_the_loss_and_leave_the_encoder_as_it_was(tmp_path, tokenizer, loss):
  config = _config()
  built = models.build(config, tokenizer)
  items = [_sample(_screen(tmp_path / f"{v}.png", v), reply=r) for v, r in ((30, REPLY), (220, "Action: tap"))]
  encode = seq2seq.EncodeSeq2Seq.fit(items, tokenizer, built.preprocess, built.image_size, 64, pad_to=8)
  batch = {k: np.stack([encode(it)[k] for it in items]) for k in encode(items[0])}
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  tx = optax.adam(3e-3)
  ts = create_train_state(built.init, tx, mesh, wrt=built.trainable)
  encoder_before = jax.device_get(nnx.state(ts.model().image_encoder))
  step, shardings = build_train_step(ts, loss, optax.constant_schedule(3e-3), mesh, batch, wrt=built.trainable)
  losses = []
  for _ in range(4):
    ts.state, metrics = step(ts.state, put_batch(batch, shardings), jax.random.key(0))
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0]
  assert float(metrics["loss_tokens"]) == batch["loss_mask"].sum()
  encoder_after = jax.device_get(nnx.state(ts.model().image_encoder))
  jax.tree.map(np.testing.assert_array_equal, encoder_before, encoder_after)


@pytest.mark.slow
def test_a_finetuned_workdir_reloads_and_acts_with_its_training_reply(tmp_path, tokenizer):
  """`pipeline.finetune` memorises one reply; the reloaded workdir's greedy policy writes it for every row of a
  padded batch, and the frozen encoder kept its initial weights through training and checkpointing."""
  config = _config(steps=20, batch_size=2)
  config.optim.update(lr=1e-2, warmup_steps=0)
  config.checkpoint.every = 20
  screen = _screen(tmp_path / "s.png", 90)
  workdir = str(tmp_path / "actor")
  finetune(config, workdir, [_sample(screen), _sample(screen)])
  loaded = load_policy(workdir)
  assert loaded.kind == "autoui" and loaded.preprocess is not None
  fresh = models.build(config, tokenizer).init()  # eager here, jitted in training: equal up to float rounding
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
               jax.device_get(nnx.state(fresh.image_encoder)), jax.device_get(nnx.state(loaded.model.image_encoder)))
  policy = ModelPolicy(loaded, device.FORMAT, temperature=0.0, max_tokens=24, max_batch=4)
  image = np.asarray(Image.open(screen).convert("RGB"))
  turns = [device.turn("Goal: hi</s>")] * 3  # 3 rows: padded to the 4-row bucket
  assert policy.generate_turns(turns, [[image]] * 3) == [REPLY] * 3
  again = ModelPolicy(load_policy(workdir), device.FORMAT, temperature=0.0, max_tokens=24)
  assert again.generate_turns(turns[:1], [[image]]) == [REPLY]
  assert policy.stats["rows"] == 3 and not policy.stats["too_long"]


@pytest.mark.slow
def test_hf_checkpoint_loads_an_autoui_directory_under_a_tower_of_its_width(tmp_path, tokenizer):
  from jaxagent.models import t5  # pylint: disable=g-import-not-at-top
  from jaxagent.models.hf import autoui as hf_autoui  # pylint: disable=g-import-not-at-top
  cfg = autoui.AutoUIConfig(t5.T5Config(vocab_size=1024, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                        num_decoder_layers=1, num_heads=4), img_dim=48)
  saved = autoui.init_autoui(cfg, seed=3)
  hf_autoui.save_pretrained(saved, cfg, str(tmp_path / "autoui"))
  config = _config()
  config.model.hf_checkpoint = str(tmp_path / "autoui")
  built = models.build(config, tokenizer)
  model = built.pretrained()
  assert model.config == cfg and model.image_encoder.tower.cfg.width == 48
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(nnx.state(saved)), jax.device_get(nnx.state(model.autoui)))
  config.model.vision.width = 64
  with pytest.raises(ValueError, match="config.model.vision.width"):
    models.build(config, tokenizer)
