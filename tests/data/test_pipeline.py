"""The IL data pipeline: its shuffle (every epoch a permutation of its own, the same wherever it is read from), and
its encoded-sample cache (the batches a cached run trains on are those encoding every use gives, in the same order,
each sample encoded once)."""

import grain
import numpy as np
import pytest

from jaxagent.data import conversation, pipeline, synthetic_conversations
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.models.vit import ImagePreprocessing


class Counting:
  def __init__(self, encode):
    self.encode, self.calls = encode, 0

  def __call__(self, item):
    self.calls += 1
    return self.encode(item)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  path = synthetic_conversations.generate(str(tmp_path_factory.mktemp("conv")), num_episodes=2, seed=3,
                                          image_size=(80, 60))
  items = conversation.load_conversations(path)
  encode = pipeline.EncodeSample(load_tokenizer(), seq_len=320, num_image_tokens=4,
                                 preprocess=ImagePreprocessing.clip(16), image_size=16, max_images=3)
  return items, encode


def _batches(ds, n):
  return [ds[i] for i in range(n)]  # the training order, without an iterator's read-ahead: exact encode counts


def _uncached(items, encode, batch_size, seed):
  """The pipeline as it was before the cache: every use of a sample encodes it."""
  return pipeline.EpochShuffle(grain.MapDataset.source(items), seed=seed).repeat(None).map(encode).batch(
      batch_size, drop_remainder=True)


@pytest.mark.parametrize("items", [1, 2, 7, 300])
def test_each_epoch_is_a_permutation_of_its_own_and_reads_the_same_from_anywhere(items):
  ds = lambda seed: pipeline.EpochShuffle(grain.MapDataset.source(range(items)), seed=seed).repeat(None)
  epochs = 6
  order = [ds(3)[i] for i in range(epochs * items)]
  by_epoch = [order[e * items:(e + 1) * items] for e in range(epochs)]
  assert all(sorted(e) == list(range(items)) for e in by_epoch)
  if items > 2:
    assert len({tuple(e) for e in by_epoch}) == epochs  # reshuffled every epoch
    assert [ds(4)[i] for i in range(items)] != by_epoch[0]  # and by the seed
  resumed = ds(3)
  assert [resumed[i] for i in reversed(range(epochs * items))] == order[::-1]  # any read order, a fresh dataset
  far = 10**12 * items + 1
  assert ds(3)[far] == ds(3)[far] and 0 <= ds(3)[far] < items


@pytest.mark.parametrize("cache_bytes", [pipeline.ENCODED_CACHE_BYTES, 0, 100_000])
def test_cached_batches_are_the_uncached_ones_and_each_sample_is_encoded_once(data, cache_bytes):
  items, encode = data
  counted = Counting(encode)
  epochs = 3
  assert len(items) % 2 == 0
  n = epochs * len(items) // 2
  got = _batches(pipeline.il_dataset(items, counted, batch_size=2, seed=5, cache_bytes=cache_bytes), n)
  want = _batches(_uncached(items, encode, 2, 5), n)
  it = iter(pipeline.il_dataset(items, encode, batch_size=2, seed=5).to_iter_dataset(pipeline.read_options(2)))
  threaded = [next(it) for _ in range(n)]  # as training reads it: two threads, read ahead
  for g, t, w in zip(got, threaded, want, strict=True):
    assert g.keys() == t.keys() == w.keys()
    for k in w:
      np.testing.assert_array_equal(g[k], w[k])
      np.testing.assert_array_equal(t[k], w[k])
  size = sum(v.nbytes for v in encode(items[0]).values() if isinstance(v, np.ndarray))
  if cache_bytes >= size * len(items):
    assert counted.calls == len(items)  # every later epoch reads what the first encoded
  elif cache_bytes == 0:
    assert counted.calls == 2 * n
  else:  # a budget for some samples: those are encoded once, the rest at every use
    kept = cache_bytes // size
    assert 0 < kept < len(items)
    assert counted.calls == kept + (len(items) - kept) * epochs


def test_a_kept_sample_cannot_be_changed_by_its_reader(data):
  items, encode = data
  once = pipeline.EncodeOnce(items, encode)
  first = once(1)
  assert once(1 + len(items)) is first  # the index of a later epoch reads the same kept sample
  with pytest.raises(ValueError, match="read-only"):
    first["input_ids"][0] = 7
  assert once.kept_bytes == sum(v.nbytes for v in first.values() if isinstance(v, np.ndarray))
