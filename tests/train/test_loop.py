"""The training loop's guard against divergence: a non-finite loss stops the run before it is checkpointed."""

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent import config_lib as common
from jaxagent.models.llama import DecoderConfig, init_decoder
from jaxagent.train import loop
from jaxagent.train.checkpoint import Checkpointer

CFG = DecoderConfig.tiny(vocab_size=64)


def _config(steps: int, every: int):
  c = common.base_config()
  c.recipe = "il"
  c.train.update(steps=steps, batch_size=2, log_every=1, progress_bar=False)
  c.checkpoint.update(every=every, async_save=False)
  return c


def _dataset():
  ids = np.arange(16, dtype=np.int32).reshape(2, 8) % CFG.vocab_size
  return grain.MapDataset.source([{"input_ids": ids}] * 8).repeat()


def _loss(scale):
  def loss_fn(model, batch, rng):
    del rng
    logits = model(batch["input_ids"]).astype(jnp.float32)
    return jnp.mean(jax.nn.logsumexp(logits, -1)) * scale, {}
  return loss_fn


@pytest.mark.slow
def test_finite_loss_trains_and_checkpoints(tmp_path):
  path = loop.train(_config(steps=2, every=1), str(tmp_path), model_fn=lambda: init_decoder(CFG, 0),
                    loss_fn=_loss(1.0), dataset=_dataset())
  assert path.endswith("/2")


@pytest.mark.slow
def test_nan_loss_raises_before_the_state_is_checkpointed(tmp_path):
  with pytest.raises(FloatingPointError, match="loss is nan at step 2"):
    loop.train(_config(steps=4, every=2), str(tmp_path), model_fn=lambda: init_decoder(CFG, 0),
               loss_fn=_loss(jnp.nan), dataset=_dataset())
  assert Checkpointer(str(tmp_path / "checkpoints"), every=2).latest_step() is None
