"""SIGTERM during training (a scheduler's preemption, `kill`): save at the end of the step in flight, then die of
the signal as the process would have, so that a restart resumes from that step instead of the last periodic
checkpoint.

    with Preemption() as preempt:
      for step in ...:
        ...; save(force=preempt.requested)
        if preempt.requested: break
    preempt.resend()   # after the checkpoint is written: the previous handler (or the default) runs

Single-process runs only: with several processes, one that saves alone would wait forever for the others at the
checkpoint's collectives, so there the signal keeps its usual effect.
"""

from __future__ import annotations

import os
import signal
import threading

import jax


class Preemption:
  """Defers SIGTERM inside its `with` block (in the main thread of a single-process run) and records it."""

  def __init__(self):
    self.requested = False
    self._previous = None
    self._installed = False

  def __enter__(self) -> "Preemption":
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      previous = signal.getsignal(signal.SIGTERM)
      if previous is not signal.SIG_IGN:
        self._previous, self._installed = previous, True
        signal.signal(signal.SIGTERM, self._on_sigterm)
    return self

  def _on_sigterm(self, signum, frame) -> None:
    del signum, frame
    self.requested = True

  def __exit__(self, *exc) -> bool:
    if self._installed:
      signal.signal(signal.SIGTERM, self._previous)
      self._installed = False
    return False

  def resend(self) -> None:
    """Outside the block, once the state is saved: the SIGTERM it deferred, to whatever handled it before."""
    if self.requested:
      os.kill(os.getpid(), signal.SIGTERM)
