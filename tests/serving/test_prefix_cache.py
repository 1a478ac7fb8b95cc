"""`serving.prefix_cache`: which cached prompt a new one continues, the byte budget, and the weights' check."""

import numpy as np

from jaxagent.serving.prefix_cache import PrefixCache, common_prefix


def _cache(n_bytes: int) -> dict:
  return {"k": np.zeros(n_bytes, np.uint8)}


def test_common_prefix_counts_the_leading_tokens_both_share():
  a = np.arange(10)
  assert common_prefix(a, a) == 10
  assert common_prefix(a, np.r_[a[:4], 99, a[5:]]) == 4
  assert common_prefix(a, a[:3]) == 3 and common_prefix(a, np.array([7])) == 0


def test_take_hands_out_the_longest_prefix_once_and_keeps_the_budget():
  cache = PrefixCache(max_bytes=300, min_tokens=4)
  cache.check_weights(("w",))
  base = np.arange(100, 120)
  cache.put(base[:10], _cache(100))
  cache.put(np.r_[base[:6], 1, 2, 3], _cache(100))
  assert cache.take(np.r_[base[:3], 50, 51]) is None  # 3 tokens shared: under min_tokens
  entry, shared = cache.take(base[:15])
  assert shared == 10 and entry["k"].nbytes == 100 and len(cache) == 1  # the longer entry, taken out
  _, shared = cache.take(np.r_[base[:6], 1, 2, 3])
  assert shared == 8  # one short of the whole prompt: its last token is still to prefill
  for i in range(4):  # 400 bytes into a 300-byte budget: the oldest goes
    cache.put(np.r_[i, base], _cache(100))
  assert len(cache) == 3 and cache.take(np.r_[0, base]) is None and cache.take(np.r_[3, base]) is not None
  cache.put(np.r_[9, base], _cache(400))  # larger than the whole budget: not kept
  assert len(cache) == 2
  cache.check_weights(("w",))
  assert len(cache) == 2
  cache.check_weights(("new weights",))
  assert len(cache) == 0
