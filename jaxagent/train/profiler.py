"""An XLA profiler window over a range of steps, set in the config (`profile.start_step`, `profile.num_steps`).

The trace goes to `<workdir>/profile` in the layout TensorBoard's profile plugin (XProf) opens.
"""

from __future__ import annotations

import os

import jax


class ProfileWindow:

  def __init__(self, logdir: str, start_step: int, num_steps: int):
    self.logdir = os.path.join(logdir, "profile")
    self.start_step = int(start_step)
    self.stop_step = self.start_step + max(1, int(num_steps))
    self.enabled = self.start_step >= 0 and jax.process_index() == 0
    self.active = False

  def before_step(self, step: int):
    """Call with the step about to run; starts the trace at `start_step`."""
    if self.enabled and not self.active and self.start_step <= step < self.stop_step:
      jax.profiler.start_trace(self.logdir)
      self.active = True

  def after_step(self, step: int, outputs=None):
    """Call with the step just run (and its outputs, which are awaited so the trace holds the work)."""
    if self.active and step + 1 >= self.stop_step:
      if outputs is not None:
        jax.block_until_ready(outputs)
      jax.profiler.stop_trace()
      self.active = False
      self.enabled = False

  def close(self):
    if self.active:
      jax.profiler.stop_trace()
      self.active = False
