"""Where each reply's content comes from in its prompt: the attention targets of the pre-training loss.

    align = alignment(ids, loss_mask, pieces)   # align[s] = s - j: reply token ids[s] is read off ids[j]; 0: none

A reply's content is the value of its `element=`, `argument=` or `message=`. A typed or answered string is sourced
at its last occurrence (as the same tokens) before the reply: the query's quoted string, or the page's value. An
element id is sourced at the last word of that element's text on the page (`<a id="26"> Office </a>` -> " Office"):
the position where a causal model has read both the element's id and its name, so one attention can look the name
up there and read the id. Tokens with no such source (syntax, ids of elements without text) get no target.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

VALUE = re.compile(r'(element|argument|message)="([^"]*)"')


def alignment(ids: Sequence[int], loss_mask: Sequence[int], pieces: Sequence[str]) -> np.ndarray:
  """align[s] = s - j for each reply token ids[s] sourced at ids[j] (j < the reply's start), else 0; `pieces[t]`
  is token t's text (`tokenizer.decode([t])`)."""
  ids = [int(t) for t in ids]
  align = np.zeros(len(ids), np.int32)
  for start, end in _runs(loss_mask):
    text, offsets = "", []
    for k in range(start, end):
      offsets.append(len(text))
      text += pieces[ids[k]]
    for m in VALUE.finditer(text):
      lo, hi = m.span(2)
      content = [start + k for k in range(end - start)
                 if offsets[k] >= lo and offsets[k] + len(pieces[ids[start + k]]) <= hi]
      if not content:
        continue
      tokens = [ids[k] for k in content]
      if m.group(1) == "element":
        source = _element_text_end(ids, start, tokens, pieces)
        if source >= 0:
          align[content[0]] = content[0] - source
      else:
        source = _last_occurrence(ids, start, tokens)
        if source >= 0:
          align[content] = np.asarray(content) - (source + np.arange(len(content)))
  return align


def _runs(mask: Sequence[int]):
  """(start, end) of each run of set flags."""
  s, n = 0, len(mask)
  while s < n:
    if not mask[s]:
      s += 1
      continue
    e = s
    while e < n and mask[e]:
      e += 1
    yield s, e
    s = e


def _last_occurrence(ids: list[int], upto: int, tokens: list[int]) -> int:
  n = len(tokens)
  for j in range(upto - n, -1, -1):
    if ids[j:j + n] == tokens:
      return j
  return -1


def _element_text_end(ids: list[int], upto: int, tokens: list[int], pieces: Sequence[str]) -> int:
  """The last word of the element whose `id="…"` is `tokens`, before `upto`; -1 when it has none."""
  n = len(tokens)
  for j in range(upto - n, 0, -1):
    if ids[j:j + n] != tokens or not "".join(pieces[t] for t in ids[max(0, j - 4):j]).endswith('id="'):
      continue
    k, last = j + n, -1
    if k >= upto or not pieces[ids[k]].startswith('"'):
      return -1
    for k in range(k + 1, upto):
      if pieces[ids[k]].lstrip().startswith("<"):
        break
      if any(ch.isalnum() for ch in pieces[ids[k]]):
        last = k
    return last
  return -1
