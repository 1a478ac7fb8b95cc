"""Fault injections against checkpoint restore: real Orbax checkpoints with files of the newest step damaged."""

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.train.checkpoint import Checkpointer


def _state(step):
  return {"w": jnp.full((4, 3), float(step)), "step": jnp.asarray(step)}


def _abstract():
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(0))


def _save(directory, steps):
  ckpt = Checkpointer(directory, every=1, keep=10, async_save=False)
  for step in steps:
    ckpt.save(step, _state(step), jax.random.key(step), {"position": step}, force=True)
  ckpt.close()


def _damage(step_dir, how):
  files = [f for f in glob.glob(os.path.join(step_dir, "state", "**", "*"), recursive=True) if os.path.isfile(f)]
  assert files, f"no array files under {step_dir}"
  for f in files:
    if how == "truncate":
      os.truncate(f, os.path.getsize(f) // 3)
    else:
      os.remove(f)


@pytest.mark.parametrize("how", ["truncate", "delete"])
def test_a_broken_newest_step_falls_back_to_the_one_before(tmp_path, how):
  directory = str(tmp_path / "checkpoints")
  _save(directory, [2, 4])
  _damage(os.path.join(directory, "4"), how)
  ckpt = Checkpointer(directory, every=1, keep=10, async_save=False)
  state, rng, data, _ = ckpt.restore(_abstract(), jax.random.key(0))
  assert int(state["step"]) == 2 and data == {"position": 2}  # model, data position and rng from one step
  np.testing.assert_array_equal(jax.random.key_data(rng), jax.random.key_data(jax.random.key(2)))
  assert glob.glob(os.path.join(directory, "4.broken-*")), "the broken step is kept, moved aside"
  assert ckpt.latest_step() == 2
  ckpt.save(4, _state(4), jax.random.key(4), {"position": 4}, force=True)  # training goes on past it
  ckpt.close()
  assert int(Checkpointer(directory, async_save=False).restore(_abstract(), jax.random.key(0))[0]["step"]) == 4


def test_with_every_step_broken_the_error_names_the_directory_and_each_step(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _save(directory, [2, 4])
  for step in (2, 4):
    _damage(os.path.join(directory, str(step)), "delete")
  with pytest.raises(RuntimeError, match=r"no checkpoint in .*checkpoints restores.*step 4.*step 2"):
    Checkpointer(directory, async_save=False).restore(_abstract(), jax.random.key(0))
