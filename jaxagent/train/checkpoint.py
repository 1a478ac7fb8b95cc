"""Orbax checkpoints of everything a run needs to continue exactly: model + optimizer state (one sharded
`nnx.State`, step included), the base RNG key and the Grain data-iterator position.

A thin wrapper so the rest of the code never touches Orbax directly (switching to Orbax v1's
`training.Checkpointer` would change this file only). A run resumes from the newest step that restores: a step
that does not (a crash or a full disk mid-write, a damaged file) is moved aside to `<step>.broken-<time>`
(kept, never deleted) with a warning, and the step before it is tried.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class Checkpointer:
  """`CheckpointManager` over `<workdir>/checkpoints`, one directory per step.

  Items: `state` (the train state, restored straight into its shardings), `rng` (key data), `data`
  (the iterator's `get_state()`, JSON) and `meta` (JSON, e.g. the config name).
  """

  def __init__(self, directory: str, *, every: int = 50, keep: int = 3, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    self.every = max(1, int(every))
    self._mngr = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(self.every),
            preservation_policy=ocp.checkpoint_managers.LatestN(int(keep)),
            enable_async_checkpointing=async_save,
            create=True))

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def path(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def save(self, step: int, state: Any, rng: jax.Array, data_state: dict | None = None,
           meta: dict | None = None, force: bool = False) -> bool:
    """Saves if the interval policy says so (or `force`); returns whether it saved."""
    args = dict(state=ocp.args.StandardSave(state),
                # numpy, not a single-device jax.Array: Orbax refuses host-local arrays on several hosts
                rng=ocp.args.StandardSave({"key": np.asarray(jax.random.key_data(rng))}),
                data=ocp.args.JsonSave(data_state or {}),
                meta=ocp.args.JsonSave(meta or {}))
    return self._mngr.save(step, args=ocp.args.Composite(**args), force=force)

  def restore(self, abstract_state: Any, rng_like: jax.Array, step: int | None = None):
    """(state, rng, data_state, meta) from `step`, or by default from the newest step that restores (the broken
    newer ones moved aside); None if there is no step."""
    if step is not None:
      try:
        return self._restore(abstract_state, rng_like, step)
      except Exception as e:  # pylint: disable=broad-except
        raise RuntimeError(f"checkpoint step {step} in {self.directory} does not restore: {type(e).__name__}: "
                           f"{e}") from e
    errors = []
    for candidate in sorted(self._mngr.all_steps(), reverse=True):
      try:
        restored = self._restore(abstract_state, rng_like, candidate)
      except Exception as e:  # pylint: disable=broad-except  # Orbax / TensorStore raise many kinds
        errors.append(f"step {candidate}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        self._set_aside(candidate, errors[-1])
        continue
      return restored
    if errors:
      raise RuntimeError(f"no checkpoint in {self.directory} restores (each moved aside to <step>.broken-*): "
                         + "; ".join(errors))
    return None

  def _set_aside(self, step: int, why: str) -> None:
    """Moves a checkpoint that does not restore aside; under several processes only process 0 renames (another
    process may still be reading it), the others just skip the step."""
    broken = f"{self.path(step)}.broken-{time.strftime('%Y%m%d-%H%M%S')}"
    if jax.process_index() != 0:
      log.warning("checkpoint %s does not restore here (%s); trying the step before it", self.path(step), why)
      return
    os.rename(self.path(step), broken)
    self._mngr.reload()
    log.warning("checkpoint %s does not restore (%s); moved to %s, trying the step before it", self.path(step),
                why, broken)

  def _restore(self, abstract_state: Any, rng_like: jax.Array, step: int):
    key_data = jax.random.key_data(rng_like)
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        rng=ocp.args.StandardRestore({"key": np.zeros(key_data.shape, key_data.dtype)}),
        data=ocp.args.JsonRestore(),
        meta=ocp.args.JsonRestore()))
    rng = jax.random.wrap_key_data(np.asarray(out["rng"]["key"]), impl=jax.random.key_impl(rng_like))
    return out["state"], rng, dict(out["data"] or {}), dict(out["meta"] or {})

  def wait(self):
    self._mngr.wait_until_finished()

  def close(self):
    self._mngr.wait_until_finished()
    self._mngr.close()
