"""Where this process stands in a multi-process (`jax.distributed`) recipe run, and the few collectives it needs.

A staged recipe runs the same code on every process: each rolls out its share of a stage's episodes
(`shard`: task i to process i % count) into its own shard of the store, every process reads the union, and
files the stages share (DONE markers, timings, results) are written by process 0 alone after a `barrier`, so no
two processes ever write one file. With one process every function here is a no-op or the identity.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

import numpy as np

T = TypeVar("T")


def process_index() -> int:
  import jax  # pylint: disable=g-import-not-at-top  # readers of stores need no JAX backend
  return jax.process_index()


def process_count() -> int:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_count()


def is_main() -> bool:
  """True on the process that writes the run's shared files (process 0)."""
  return process_index() == 0


def barrier(name: str) -> None:
  """Every process waits here until all have arrived (a no-op with one process). `name` must be the same on
  every process: a mismatch means they took different paths through the recipe, and JAX raises."""
  if process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def agree(flag: bool) -> bool:
  """Process 0's `flag` on every process: one decision (e.g. "this stage is done") that all processes follow,
  whatever each one's view of a shared filesystem."""
  if process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def shard(items: Sequence[T], index: int, count: int) -> list[T]:
  """Process `index`'s share of `items` among `count` processes: items i with i % count == index (balanced to
  one item, and a task keeps its process whatever the others' progress)."""
  if not 0 <= index < count:
    raise ValueError(f"process index {index} is outside 0..{count - 1}")
  return list(items[index::count])
