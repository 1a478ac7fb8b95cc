"""Packed rows: many tokenised samples side by side in fixed-length rows, so that no step pays for padding.

    rows = pack([(ids, loss), ...], seq_len=2048)   # {"input_ids", "targets", "loss_mask", "segment_ids"} [N, L]

Each sample keeps its own next-token pairs (its inputs are `ids[:-1]`, its targets `ids[1:]`), so no target
crosses into the next sample; `segment_ids` numbers the samples of a row from 1 (0 = padding at the row's end) and
the decoder (`models.llama.Decoder`, `segment_ids=`) attends only within a segment, positions restarting at each.
A row trains exactly as its samples would one by one (`tests/data/test_packing.py`). Rows are filled best-fit,
longest sample first: a deterministic function of the samples, nearly without waste when most are short.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np

FIELDS = ("input_ids", "targets", "loss_mask", "segment_ids")
# `config.data.packing`, how a fine-tuning stage batches its samples (`pipeline.finetune`): "pack" (rows of several
# samples, here), "pad" (one sample a row, padded to the longest), "auto" (pack where the model and loss allow)
PACKING = ("auto", "pack", "pad")


def pack(samples: Sequence[tuple[np.ndarray, np.ndarray]], seq_len: int, pad_id: int = 0,
         scalars: dict[str, Sequence[float]] | None = None) -> dict[str, np.ndarray]:
  """`samples` (token ids, per-token loss flags) packed into rows of `seq_len` next-token pairs. A sample longer
  than `seq_len + 1` tokens is cut to its first `seq_len + 1` (the caller sizes `seq_len` so that none is).
  `scalars` (name -> one value per sample, e.g. a loss weight) become float32 [N, seq_len] fields holding each
  sample's value on its own tokens (0 on padding), since a row no longer is one sample."""
  if seq_len < 1:
    raise ValueError(f"pack: seq_len={seq_len} must be >= 1")
  lengths = [min(len(ids), seq_len + 1) - 1 for ids, _ in samples]
  order = sorted((k for k in range(len(samples)) if lengths[k] > 0), key=lambda k: (-lengths[k], k))
  rows: list[list[int]] = []
  free: list[tuple[int, int]] = []  # (space left, row index), sorted: best fit = the first with enough space
  for k in order:
    at = bisect.bisect_left(free, (lengths[k], -1))
    if at == len(free):
      rows.append([k])
      room, row = seq_len - lengths[k], len(rows) - 1
    else:
      room, row = free.pop(at)
      rows[row].append(k)
      room -= lengths[k]
    if room > 0:
      bisect.insort(free, (room, row))
  out = {"input_ids": np.full((len(rows), seq_len), pad_id, np.int32),
         "targets": np.full((len(rows), seq_len), pad_id, np.int32),
         "loss_mask": np.zeros((len(rows), seq_len), np.int32),
         "segment_ids": np.zeros((len(rows), seq_len), np.int32)}
  scalars = dict(scalars or {})
  for name, values in scalars.items():
    if len(values) != len(samples):
      raise ValueError(f"pack: scalars[{name!r}] has {len(values)} values for {len(samples)} samples")
    out[name] = np.zeros((len(rows), seq_len), np.float32)
  for r, members in enumerate(rows):
    at = 0
    for segment, k in enumerate(members, start=1):
      ids, loss = samples[k]
      n = lengths[k]
      out["input_ids"][r, at:at + n] = ids[:n]
      out["targets"][r, at:at + n] = ids[1:n + 1]
      out["loss_mask"][r, at:at + n] = loss[1:n + 1]
      out["segment_ids"][r, at:at + n] = segment
      for name, values in scalars.items():
        out[name][r, at:at + n] = values[k]
      at += n
  return out


def fill(rows: dict[str, np.ndarray]) -> float:
  """The share of the rows' slots that hold a sample's token (1.0: no padding at all)."""
  return float((rows["segment_ids"] > 0).mean()) if rows["segment_ids"].size else 0.0
