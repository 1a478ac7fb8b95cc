"""The keys and values of recent prompts, kept so that a prompt that begins as one of them did skips that part.

An agent's consecutive prompts in an episode share their beginning (the system prompt, the intent, the actions so
far) and differ in the page: the engine prefills only what follows the longest cached prefix
(`sampler.sample_rows`' `prefixes`). Entries are a prompt's token ids and its row cache (batch 1), held within a
byte budget, the least recently used dropped first. A cache is only valid for the weights that wrote it: the
engine passes a fingerprint of the model's arrays, and a new one empties the cache.
"""

from __future__ import annotations

import collections
from typing import Any

import jax
import numpy as np


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
  """How many leading tokens `a` and `b` share."""
  m = min(len(a), len(b))
  differ = np.flatnonzero(a[:m] != b[:m])
  return int(differ[0]) if len(differ) else m


class PrefixCache:
  """Row caches by prompt, within `max_bytes`; `take` hands out the longest usable prefix of a new prompt."""

  def __init__(self, max_bytes: int, min_tokens: int = 64):
    self.max_bytes = int(max_bytes)
    self.min_tokens = int(min_tokens)
    self._entries: collections.OrderedDict[int, tuple[np.ndarray, Any, int]] = collections.OrderedDict()
    self._bytes = 0
    self._next = 0
    self._weights: tuple | None = None

  def __len__(self) -> int:
    return len(self._entries)

  def check_weights(self, fingerprint: tuple) -> None:
    """Empties the cache when the model's arrays are not the ones its entries were computed with."""
    if fingerprint != self._weights:
      self._entries.clear()
      self._bytes = 0
      self._weights = fingerprint

  def take(self, ids: np.ndarray) -> tuple[Any, int] | None:
    """(row cache, n) of the entry sharing the most leading tokens with `ids`, if ≥ `min_tokens`; n stops one
    short of the whole prompt (its last token's logits are still to compute). The entry leaves the cache: the
    prompt that continues it is stored in its place (`put`)."""
    best, shared = None, 0
    for key, (prompt, _, _) in self._entries.items():
      n = min(common_prefix(prompt, ids), len(ids) - 1)
      if n > shared:
        best, shared = key, n
    if best is None or shared < self.min_tokens:
      return None
    _, cache, size = self._entries.pop(best)
    self._bytes -= size
    return cache, shared

  def put(self, ids: np.ndarray, cache: Any) -> None:
    size = sum(x.nbytes for x in jax.tree.leaves(cache))
    if size > self.max_bytes:
      return
    self._entries[self._next] = (np.asarray(ids), cache, size)
    self._next += 1
    self._bytes += size
    while self._bytes > self.max_bytes:
      _, (_, _, dropped) = self._entries.popitem(last=False)
      self._bytes -= dropped
